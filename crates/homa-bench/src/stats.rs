//! Benchmark results: latency rows from HDR histograms (per transport and
//! size, or per decile of a workload's sizes), throughput rows, plain-text
//! tables and the JSON object printed with `--json`.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latency of one transport at one message size.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LatencyRow {
    pub transport: String,
    pub size: usize,
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
}

/// Throughput of one transport at one message size.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ThroughputRow {
    pub transport: String,
    pub size: usize,
    pub count: u64,
    pub gbps: f64,
}

/// `{"rows": [...]}`, the shape every benchmark prints with `--json`.
#[derive(Serialize)]
pub struct Report<T: Serialize> {
    pub rows: Vec<T>,
}

/// A histogram of nanosecond samples from 1 ns to 100 s, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid histogram bounds")
}

/// Records a sample, clamping it into the histogram's range.
pub fn record(h: &mut Histogram<u64>, ns: u64) {
    h.saturating_record(ns.max(1));
}

impl LatencyRow {
    pub fn from_histogram(transport: &str, size: usize, h: &Histogram<u64>) -> LatencyRow {
        let us = |q: f64| (h.value_at_quantile(q) as f64 / 1000.0 * 100.0).round() / 100.0;
        LatencyRow {
            transport: transport.to_string(),
            size,
            count: h.len(),
            p50_us: us(0.5),
            p99_us: us(0.99),
            p999_us: us(0.999),
        }
    }
}

/// Round-trip times of the RPCs in one tenth of a run's sizes.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct DecileRow {
    /// Largest size in the decile.
    pub max_size: u32,
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// RPCs `(size, round-trip ns)` ordered by size and cut into ten groups of
/// (nearly) equal count, with each group's latency quantiles. Empty input,
/// no rows; fewer than ten RPCs, one row per RPC.
pub fn latency_by_size_decile(samples: &[(u32, u64)]) -> Vec<DecileRow> {
    let mut v = samples.to_vec();
    v.sort_unstable();
    let n = v.len();
    let groups = n.min(10);
    (0..groups)
        .map(|k| {
            let part = &v[k * n / groups..(k + 1) * n / groups];
            let mut h = new_histogram();
            for &(_, ns) in part {
                record(&mut h, ns);
            }
            let us = |q: f64| (h.value_at_quantile(q) as f64 / 10.0).round() / 100.0;
            DecileRow {
                max_size: part.last().map_or(0, |s| s.0),
                count: h.len(),
                p50_us: us(0.5),
                p99_us: us(0.99),
            }
        })
        .collect()
}

/// Gbit/s for `bytes` moved in `secs`.
pub fn gbps(bytes: u64, secs: f64) -> f64 {
    if secs <= 0.0 {
        return 0.0;
    }
    (bytes as f64 * 8.0 / secs / 1e9 * 1000.0).round() / 1000.0
}

pub fn print_latency_table(rows: &[LatencyRow]) {
    println!(
        "{:<10} {:>9} {:>8} {:>10} {:>10} {:>10}",
        "transport", "size", "count", "p50 µs", "p99 µs", "p99.9 µs"
    );
    for r in rows {
        println!(
            "{:<10} {:>9} {:>8} {:>10.2} {:>10.2} {:>10.2}",
            r.transport, r.size, r.count, r.p50_us, r.p99_us, r.p999_us
        );
    }
}

pub fn print_throughput_table(rows: &[ThroughputRow]) {
    println!(
        "{:<10} {:>9} {:>9} {:>9}",
        "transport", "size", "messages", "Gbit/s"
    );
    for r in rows {
        println!(
            "{:<10} {:>9} {:>9} {:>9.2}",
            r.transport, r.size, r.count, r.gbps
        );
    }
}

/// The JSON line for `--json`.
pub fn to_json<T: Serialize>(rows: Vec<T>) -> String {
    serde_json::to_string(&Report { rows }).expect("rows serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_quantiles_are_in_microseconds() {
        let mut h = new_histogram();
        for i in 1..=1000u64 {
            record(&mut h, i * 1000);
        }
        let r = LatencyRow::from_histogram("udp", 100, &h);
        assert_eq!(r.count, 1000);
        assert!((r.p50_us - 500.0).abs() < 1.0, "{r:?}");
        assert!((r.p99_us - 990.0).abs() < 2.0, "{r:?}");
        assert!(r.p999_us >= r.p99_us);
    }

    #[test]
    fn deciles_split_by_size_and_read_microseconds() {
        // Sizes 1..=100, each RPC taking `size` µs.
        let samples: Vec<(u32, u64)> = (1..=100u32).rev().map(|s| (s, s as u64 * 1000)).collect();
        let rows = latency_by_size_decile(&samples);
        assert_eq!(rows.len(), 10);
        assert_eq!(rows[0].max_size, 10);
        assert_eq!(rows[9].max_size, 100);
        assert!(rows.iter().all(|r| r.count == 10));
        assert!((rows[0].p50_us - 5.0).abs() < 0.1, "{:?}", rows[0]);
        assert!((rows[9].p99_us - 100.0).abs() < 0.2, "{:?}", rows[9]);
        assert_eq!(latency_by_size_decile(&[(5, 1000), (6, 2000)]).len(), 2);
        assert!(latency_by_size_decile(&[]).is_empty());
    }

    #[test]
    fn json_has_the_documented_shape() {
        let rows = vec![LatencyRow {
            transport: "homa".into(),
            size: 100,
            count: 3,
            p50_us: 1.5,
            p99_us: 2.0,
            p999_us: 2.5,
        }];
        let v: serde_json::Value = serde_json::from_str(&to_json(rows)).unwrap();
        let row = &v["rows"][0];
        assert_eq!(row["transport"], "homa");
        assert_eq!(row["size"], 100);
        assert_eq!(row["count"], 3);
        assert_eq!(row["p50_us"], 1.5);
        assert_eq!(row["p999_us"], 2.5);
        let t = to_json(vec![ThroughputRow {
            transport: "tcp".into(),
            size: 500_000,
            count: 10,
            gbps: gbps(1_250_000_000, 1.0),
        }]);
        let v: serde_json::Value = serde_json::from_str(&t).unwrap();
        assert_eq!(v["rows"][0]["gbps"], 10.0);
    }
}
