//! Slowdown statistics: messages ordered by size, split into groups of equal
//! count (deciles, the largest 1%, or finer bins for plots), with the median
//! and 99th-percentile slowdown of each group.

use serde::Serialize;

/// One delivered message.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Completion {
    /// Message length in bytes.
    pub size: u32,
    /// Time from the application's send to delivery at the receiver (ns).
    pub latency_ns: u64,
    /// Best-case latency for this size on the unloaded network (ns).
    pub best_ns: u64,
    /// The message crossed the aggregation layer (else it stayed under one switch).
    pub core: bool,
}

impl Completion {
    pub fn slowdown(&self) -> f64 {
        self.latency_ns as f64 / self.best_ns.max(1) as f64
    }
}

/// Statistics of one group of messages of neighbouring sizes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Group {
    pub min_size: u32,
    pub max_size: u32,
    pub count: usize,
    pub p50_slowdown: f64,
    pub p99_slowdown: f64,
    pub mean_slowdown: f64,
    /// Fraction of all messages in this and every smaller group (the x
    /// coordinate of the group's right edge on a count-weighted axis).
    pub cum_fraction: f64,
}

/// Nearest-rank percentile of an ascending slice (`p` in 0..=100).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Messages ordered by (size, slowdown) so that every grouping is
/// deterministic even when sizes tie. The sorts are unstable (quicker, no
/// scratch buffer): elements that compare equal are equal in every field,
/// so the order is the same as a stable sort's.
pub struct SlowdownTable {
    sorted: Vec<(u32, f64)>,
}

impl SlowdownTable {
    pub fn new(completions: &[Completion]) -> SlowdownTable {
        let mut sorted: Vec<(u32, f64)> =
            completions.iter().map(|c| (c.size, c.slowdown())).collect();
        sorted.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        SlowdownTable { sorted }
    }

    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// Statistics of messages `lo..hi` in size order.
    fn group(&self, lo: usize, hi: usize) -> Group {
        let slice = &self.sorted[lo..hi];
        let mut s: Vec<f64> = slice.iter().map(|x| x.1).collect();
        s.sort_unstable_by(f64::total_cmp);
        let n = s.len();
        Group {
            min_size: slice.first().map_or(0, |x| x.0),
            max_size: slice.last().map_or(0, |x| x.0),
            count: n,
            p50_slowdown: percentile(&s, 50.0),
            p99_slowdown: percentile(&s, 99.0),
            mean_slowdown: if n == 0 {
                f64::NAN
            } else {
                s.iter().sum::<f64>() / n as f64
            },
            cum_fraction: hi as f64 / self.sorted.len().max(1) as f64,
        }
    }

    /// `n` groups of (nearly) equal count, smallest messages first. Groups that
    /// would be empty (fewer messages than groups) are omitted.
    pub fn groups(&self, n: usize) -> Vec<Group> {
        let len = self.sorted.len();
        (0..n)
            .map(|i| (i * len / n, (i + 1) * len / n))
            .filter(|(lo, hi)| hi > lo)
            .map(|(lo, hi)| self.group(lo, hi))
            .collect()
    }

    /// Largest message size of the smallest decile (0 if there are no
    /// messages): `deciles()[0].max_size` without the deciles' statistics.
    pub fn first_decile_max_size(&self) -> u32 {
        let end = (self.sorted.len() / 10).max(1);
        self.sorted.get(end - 1).map_or(0, |x| x.0)
    }

    /// Deciles of messages ordered by size.
    pub fn deciles(&self) -> Vec<Group> {
        self.groups(10)
    }

    /// The largest 1% of messages (at least one message if there are any).
    pub fn top_percent(&self) -> Group {
        let len = self.sorted.len();
        let k = len.div_ceil(100);
        self.group(len - k, len)
    }

    /// All messages together.
    pub fn overall(&self) -> Group {
        self.group(0, self.sorted.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(size: u32, latency: u64, best: u64) -> Completion {
        Completion {
            size,
            latency_ns: latency,
            best_ns: best,
            core: false,
        }
    }

    #[test]
    fn first_decile_max_size_is_the_first_deciles() {
        for n in [1u32, 5, 9, 10, 11, 99, 100, 1234] {
            let v: Vec<Completion> = (0..n).map(|i| c(1000 + (i * 7919) % 5000, 10, 1)).collect();
            let t = SlowdownTable::new(&v);
            assert_eq!(
                t.first_decile_max_size(),
                t.deciles()[0].max_size,
                "{n} messages"
            );
        }
        assert_eq!(SlowdownTable::new(&[]).first_decile_max_size(), 0);
    }

    #[test]
    fn percentile_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn deciles_split_by_size_with_equal_counts() {
        // 1000 messages: size i, slowdown 1 + (i % 100)/100.
        let v: Vec<Completion> = (0..1000u32)
            .rev()
            .map(|i| c(i + 1, 100 + (i % 100) as u64, 100))
            .collect();
        let t = SlowdownTable::new(&v);
        let d = t.deciles();
        assert_eq!(d.len(), 10);
        for (k, g) in d.iter().enumerate() {
            assert_eq!(g.count, 100);
            assert_eq!(g.min_size, 100 * k as u32 + 1);
            assert_eq!(g.max_size, 100 * (k as u32 + 1));
            assert_eq!(g.p50_slowdown, 1.49);
            assert_eq!(g.p99_slowdown, 1.98);
            assert!((g.cum_fraction - (k + 1) as f64 / 10.0).abs() < 1e-12);
        }
        let top = t.top_percent();
        assert_eq!((top.count, top.min_size, top.max_size), (10, 991, 1000));
        assert_eq!(t.overall().count, 1000);
    }

    #[test]
    fn few_messages_still_give_groups() {
        let v = vec![c(5, 200, 100), c(1, 100, 100), c(3, 300, 100)];
        let t = SlowdownTable::new(&v);
        let d = t.deciles();
        assert_eq!(d.iter().map(|g| g.count).sum::<usize>(), 3);
        assert_eq!(d.last().unwrap().max_size, 5);
        assert_eq!(t.top_percent().p99_slowdown, 2.0);
    }

    #[test]
    fn grouping_is_independent_of_input_order() {
        let mut v: Vec<Completion> = (0..500u32)
            .map(|i| c(i % 7 + 1, 100 + (i * 37 % 101) as u64, 100))
            .collect();
        let a = SlowdownTable::new(&v).deciles();
        v.reverse();
        assert_eq!(a, SlowdownTable::new(&v).deciles());
    }
}
