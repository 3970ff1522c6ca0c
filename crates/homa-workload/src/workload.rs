//! Message-size distributions: the paper's workloads W1–W5 (embedded), fixed
//! sizes, and user-supplied CSV files, with an optional length cap.
//!
//! A distribution is a list of (length, weight) points; a sample draws a point
//! with probability proportional to its weight (no interpolation), as the data's
//! README prescribes.

use rand::Rng;
use thiserror::Error;

const W1: &str = include_str!("../workloads/w1.csv");
const W2: &str = include_str!("../workloads/w2.csv");
const W3: &str = include_str!("../workloads/w3.csv");
const W4: &str = include_str!("../workloads/w4.csv");
const W5: &str = include_str!("../workloads/w5.csv");

/// Names accepted by [`Workload::builtin`].
pub const BUILTIN: [&str; 5] = ["w1", "w2", "w3", "w4", "w5"];

/// A workload specification could not be turned into a distribution.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum WorkloadError {
    #[error("unknown workload {0:?} (expected w1..w5, fixed:BYTES or a CSV file path)")]
    Unknown(String),
    #[error("line {line}: {msg}")]
    Parse { line: usize, msg: String },
    #[error("the distribution has no point with positive weight")]
    Empty,
    #[error("cannot read {path}: {msg}")]
    Io { path: String, msg: String },
}

/// A message-size distribution, ready for sampling.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// Name used in reports ("w3", "fixed:1000", the CSV's path).
    pub name: String,
    /// Points sorted by ascending length, lengths unique, weights positive.
    points: Vec<(u32, f64)>,
    /// `cumulative[i]` = sum of weights of points `0..=i`, normalised so the
    /// last entry is exactly 1.
    cumulative: Vec<f64>,
    /// `guide[k]` = the first `i` with `cumulative[i] > k / guide.len()`
    /// (a power of two, so the bucket of `u` is exact): a sample starts its
    /// search there instead of bisecting all points, same result.
    guide: Vec<u32>,
    /// Lengths above this were replaced by it (`None`: uncapped).
    pub cap: Option<u32>,
}

impl Workload {
    /// One of the paper's workloads W1–W5, by name (case-insensitive).
    pub fn builtin(name: &str) -> Result<Workload, WorkloadError> {
        let text = match name.to_ascii_lowercase().as_str() {
            "w1" => W1,
            "w2" => W2,
            "w3" => W3,
            "w4" => W4,
            "w5" => W5,
            _ => return Err(WorkloadError::Unknown(name.to_string())),
        };
        Workload::from_csv(&name.to_ascii_lowercase(), text)
    }

    /// Every message has `len` bytes.
    pub fn fixed(len: u32) -> Workload {
        Workload::from_points(format!("fixed:{len}"), vec![(len, 1.0)]).expect("one positive point")
    }

    /// `w1`..`w5`, `fixed:BYTES`, or a path to a CSV file.
    pub fn parse(spec: &str) -> Result<Workload, WorkloadError> {
        if BUILTIN.contains(&spec.to_ascii_lowercase().as_str()) {
            return Workload::builtin(spec);
        }
        if let Some(n) = spec.strip_prefix("fixed:") {
            let len: u32 = n
                .trim()
                .parse()
                .map_err(|_| WorkloadError::Unknown(spec.to_string()))?;
            return Ok(Workload::fixed(len));
        }
        if std::path::Path::new(spec).exists() {
            let text = std::fs::read_to_string(spec).map_err(|e| WorkloadError::Io {
                path: spec.to_string(),
                msg: e.to_string(),
            })?;
            return Workload::from_csv(spec, &text);
        }
        Err(WorkloadError::Unknown(spec.to_string()))
    }

    /// Parses `length_bytes,weight` lines. A first line that does not parse as
    /// numbers is taken as a header; blank lines and `#` comments are skipped.
    pub fn from_csv(name: &str, text: &str) -> Result<Workload, WorkloadError> {
        let mut points = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.split(',').map(str::trim);
            let (a, b) = match (fields.next(), fields.next(), fields.next()) {
                (Some(a), Some(b), None) => (a, b),
                _ => {
                    return Err(WorkloadError::Parse {
                        line: i + 1,
                        msg: format!("expected two comma-separated fields, got {line:?}"),
                    })
                }
            };
            match (a.parse::<u32>(), b.parse::<f64>()) {
                (Ok(len), Ok(w)) => {
                    if !(w.is_finite() && w >= 0.0) {
                        return Err(WorkloadError::Parse {
                            line: i + 1,
                            msg: format!("weight {b} is not a non-negative number"),
                        });
                    }
                    if len == 0 {
                        return Err(WorkloadError::Parse {
                            line: i + 1,
                            msg: "message length 0".into(),
                        });
                    }
                    points.push((len, w));
                }
                _ if points.is_empty() && i == first_content_line(text) => {} // header
                _ => {
                    return Err(WorkloadError::Parse {
                        line: i + 1,
                        msg: format!("cannot parse {line:?} as length,weight"),
                    })
                }
            }
        }
        Workload::from_points(name.to_string(), points)
    }

    /// Builds a distribution from (length, weight) points in any order;
    /// duplicate lengths are merged and zero weights dropped.
    pub fn from_points(
        name: String,
        mut points: Vec<(u32, f64)>,
    ) -> Result<Workload, WorkloadError> {
        points.retain(|p| p.1 > 0.0);
        points.sort_by_key(|p| p.0);
        let mut merged: Vec<(u32, f64)> = Vec::with_capacity(points.len());
        for (len, w) in points {
            match merged.last_mut() {
                Some(last) if last.0 == len => last.1 += w,
                _ => merged.push((len, w)),
            }
        }
        if merged.is_empty() {
            return Err(WorkloadError::Empty);
        }
        let total: f64 = merged.iter().map(|p| p.1).sum();
        let mut acc = 0.0;
        let mut cumulative: Vec<f64> = merged
            .iter()
            .map(|p| {
                acc += p.1;
                acc / total
            })
            .collect();
        *cumulative.last_mut().unwrap() = 1.0;
        for p in &mut merged {
            p.1 /= total;
        }
        let buckets = (4 * merged.len()).next_power_of_two();
        let guide = (0..buckets)
            .map(|k| {
                let lo = k as f64 / buckets as f64;
                cumulative.partition_point(|&c| c <= lo) as u32
            })
            .collect();
        Ok(Workload {
            name,
            points: merged,
            cumulative,
            guide,
            cap: None,
        })
    }

    /// The same distribution with every length above `cap` replaced by `cap`
    /// (the Linux benchmarks' convention; the paper's simulations are uncapped).
    pub fn capped(&self, cap: u32) -> Workload {
        let points = self.points.iter().map(|&(l, w)| (l.min(cap), w)).collect();
        let mut w = Workload::from_points(self.name.clone(), points).expect("non-empty");
        w.cap = Some(cap);
        w
    }

    /// The distribution as the engine takes it (the same points and
    /// weights), for `homa_proto::NetworkProfile::message_sizes`, from which
    /// the engine derives its unscheduled priority plan.
    pub fn message_sizes(&self) -> homa_proto::priorities::MessageSizes {
        homa_proto::priorities::MessageSizes::from_weights(self.points().iter().copied())
            .expect("a workload has points of positive weight")
    }

    /// (length, probability) points in ascending length; probabilities sum to 1.
    pub fn points(&self) -> &[(u32, f64)] {
        &self.points
    }

    /// Mean message length in bytes.
    pub fn mean(&self) -> f64 {
        self.points.iter().map(|&(l, w)| l as f64 * w).sum()
    }

    pub fn max_len(&self) -> u32 {
        self.points.last().unwrap().0
    }

    pub fn min_len(&self) -> u32 {
        self.points[0].0
    }

    /// Draws one message length.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> u32 {
        self.points[self.point_at(rng.gen())].0
    }

    /// Index of the first point whose cumulative probability exceeds `u`
    /// (in `[0, 1)`), or the last point. Every point before `guide[k]` has
    /// cumulative <= k / buckets <= u (exact, as the bucket count is a power
    /// of two), so the search starts there.
    fn point_at(&self, u: f64) -> usize {
        let k = (u * self.guide.len() as f64) as usize;
        let mut i = self.guide[k.min(self.guide.len() - 1)] as usize;
        while i < self.cumulative.len() && self.cumulative[i] <= u {
            i += 1;
        }
        i.min(self.points.len() - 1)
    }

    /// Probability that a message is at most `len` bytes long.
    pub fn cdf(&self, len: u32) -> f64 {
        let i = self.points.partition_point(|p| p.0 <= len);
        if i == 0 {
            0.0
        } else {
            self.cumulative[i - 1]
        }
    }

    /// Smallest length `l` with `cdf(l) >= q`.
    pub fn quantile(&self, q: f64) -> u32 {
        let i = self.cumulative.partition_point(|&c| c < q);
        self.points[i.min(self.points.len() - 1)].0
    }
}

fn first_content_line(text: &str) -> usize {
    text.lines()
        .position(|l| {
            let l = l.trim();
            !l.is_empty() && !l.starts_with('#')
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// Means from /work/shared/workloads/README.md (uncapped, capped at 1 MB).
    const README_MEANS: [(&str, f64, f64, u32, u32); 5] = [
        ("w1", 189.0, 189.0, 27, 1_876),
        ("w2", 442.0, 433.0, 269, 3_151),
        ("w3", 2_928.0, 2_423.0, 268, 31_013),
        ("w4", 127_797.0, 60_175.0, 662, 3_430_822),
        ("w5", 2_564_690.0, 385_316.0, 72_030, 27_440_490),
    ];

    #[test]
    fn builtin_means_match_the_readme() {
        for (name, mean, capped, _, _) in README_MEANS {
            let w = Workload::builtin(name).unwrap();
            assert!(
                (w.mean() - mean).abs() <= 1.0,
                "{name}: {} vs {mean}",
                w.mean()
            );
            let c = w.capped(1_000_000);
            assert!(
                (c.mean() - capped).abs() <= 1.0,
                "{name} capped: {} vs {capped}",
                c.mean()
            );
            assert_eq!(c.cap, Some(1_000_000));
            assert!(c.max_len() <= 1_000_000);
        }
    }

    #[test]
    fn builtin_medians_and_p99_match_the_readme() {
        for (name, _, _, median, p99) in README_MEANS {
            let w = Workload::builtin(name).unwrap();
            // The README rounds; quantiles of a discrete distribution fall on points.
            let m = w.quantile(0.5) as f64;
            assert!(
                (m - median as f64).abs() / (median as f64) < 0.05,
                "{name} median {m}"
            );
            let p = w.quantile(0.99) as f64;
            assert!(
                (p - p99 as f64).abs() / (p99 as f64) < 0.05,
                "{name} p99 {p}"
            );
        }
    }

    #[test]
    fn sample_mean_converges_to_distribution_mean() {
        for name in ["w1", "w2", "w3"] {
            let w = Workload::builtin(name).unwrap();
            let mut rng = ChaCha8Rng::seed_from_u64(42);
            let n = 200_000;
            let s: f64 = (0..n).map(|_| w.sample(&mut rng) as f64).sum::<f64>() / n as f64;
            assert!(
                (s - w.mean()).abs() / w.mean() < 0.05,
                "{name}: sample mean {s} vs {}",
                w.mean()
            );
        }
    }

    #[test]
    fn sampling_is_deterministic_per_seed() {
        let w = Workload::builtin("w4").unwrap();
        let draw = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            (0..100).map(|_| w.sample(&mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn guided_sampling_equals_bisection() {
        for name in ["w1", "w2", "w3", "w4", "w5"] {
            let w = Workload::builtin(name).unwrap();
            let bisect = |u: f64| {
                let i = w.cumulative.partition_point(|&c| c <= u);
                i.min(w.points.len() - 1)
            };
            // Every bucket edge and every cumulative value, just below, at
            // and just above, plus random draws.
            let n = w.guide.len();
            let mut us: Vec<f64> = (0..n).map(|k| k as f64 / n as f64).collect();
            us.extend(w.cumulative.iter().copied());
            let mut rng = ChaCha8Rng::seed_from_u64(9);
            us.extend((0..20_000).map(|_| rng.gen::<f64>()));
            for u in us {
                let (below, above) = (
                    f64::from_bits(u.to_bits().saturating_sub(1)),
                    f64::from_bits(u.to_bits() + 1),
                );
                for v in [u, below, above] {
                    if (0.0..1.0).contains(&v) {
                        assert_eq!(w.point_at(v), bisect(v), "{name} u={v}");
                    }
                }
            }
        }
    }

    #[test]
    fn sample_hits_only_points_with_right_frequencies() {
        let w = Workload::from_points("t".into(), vec![(10, 3.0), (20, 1.0)]).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let n = 40_000;
        let tens = (0..n).filter(|_| w.sample(&mut rng) == 10).count();
        assert!((tens as f64 / n as f64 - 0.75).abs() < 0.02);
    }

    #[test]
    fn csv_parsing() {
        let w =
            Workload::from_csv("x", "length_bytes,weight\n100, 1\n\n# c\n50,3\n100,0.5\n").unwrap();
        assert_eq!(w.points(), &[(50, 3.0 / 4.5), (100, 1.5 / 4.5)]);
        assert_eq!(w.cdf(49), 0.0);
        assert!((w.cdf(50) - 3.0 / 4.5).abs() < 1e-12);
        assert_eq!(w.cdf(1000), 1.0);
        assert!(Workload::from_csv("x", "a,b\n1,2\nfoo,1\n").is_err());
        assert!(Workload::from_csv("x", "1,2,3\n").is_err());
        assert!(Workload::from_csv("x", "1,-2\n").is_err());
        assert!(Workload::from_csv("x", "0,1\n").is_err());
        assert_eq!(
            Workload::from_csv("x", "h,w\n").unwrap_err(),
            WorkloadError::Empty
        );
        assert_eq!(
            Workload::from_csv("x", "5,0\n").unwrap_err(),
            WorkloadError::Empty
        );
    }

    #[test]
    fn parse_specs() {
        assert_eq!(Workload::parse("W3").unwrap().name, "w3");
        let f = Workload::parse("fixed:1000").unwrap();
        assert_eq!((f.min_len(), f.max_len(), f.mean()), (1000, 1000, 1000.0));
        assert!(Workload::parse("fixed:x").is_err());
        assert!(Workload::parse("w9").is_err());
    }
}
