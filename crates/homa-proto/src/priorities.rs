//! The unscheduled priority plan: how many priority levels go to unscheduled
//! packets and the message-length cutoffs between them, computed from a
//! message-size distribution as in the Homa paper. Protocol policy, so it
//! lives in the engine; [`crate::Config::for_network`] applies it.
//!
//! The unscheduled levels get a share of the available levels in proportion
//! to the fraction of bytes that are sent unscheduled (rounded; a share
//! between 1 and 1.5 levels gets two when there are at least three levels),
//! and the cutoffs between unscheduled levels split the unscheduled bytes
//! evenly.

use crate::config::{Config, ConfigError};
use crate::wire::MAX_PRIORITIES;

/// A message-size distribution: `(length, weight)` points in ascending,
/// distinct lengths with positive weights. Weights are relative (they need
/// not sum to 1): a weight is the probability of that length up to a common
/// factor.
#[derive(Clone, Debug, PartialEq)]
pub struct MessageSizes {
    points: Vec<(u32, f64)>,
}

impl MessageSizes {
    /// From `(length, weight)` points in any order. Points with a weight
    /// that is not positive are dropped, equal lengths merged. Fails when
    /// no point is left or a weight is not finite.
    pub fn from_weights(points: impl IntoIterator<Item = (u32, f64)>) -> Result<Self, ConfigError> {
        let mut pts: Vec<(u32, f64)> = Vec::new();
        for (len, w) in points {
            if !w.is_finite() {
                return Err(ConfigError(format!(
                    "message size {len}: weight {w} is not finite"
                )));
            }
            if w > 0.0 {
                pts.push((len, w));
            }
        }
        pts.sort_by_key(|p| p.0);
        let mut merged: Vec<(u32, f64)> = Vec::with_capacity(pts.len());
        for (len, w) in pts {
            match merged.last_mut() {
                Some(last) if last.0 == len => last.1 += w,
                _ => merged.push((len, w)),
            }
        }
        if merged.is_empty() {
            return Err(ConfigError(
                "a message-size distribution needs a point of positive weight".into(),
            ));
        }
        Ok(MessageSizes { points: merged })
    }

    /// From cumulative points `(length, fraction of messages no longer than
    /// length)`: lengths ascending, fractions non-decreasing (the last one
    /// is the total, normally 1).
    pub fn from_cdf(points: &[(u32, f64)]) -> Result<Self, ConfigError> {
        let mut prev = (0u32, 0.0f64);
        let mut weights = Vec::with_capacity(points.len());
        for (i, &(len, cum)) in points.iter().enumerate() {
            if (i > 0 && len <= prev.0) || cum < prev.1 || !cum.is_finite() {
                return Err(ConfigError(format!(
                    "CDF point {i} ({len}, {cum}) must have an ascending length and a non-decreasing fraction"
                )));
            }
            weights.push((len, cum - prev.1));
            prev = (len, cum);
        }
        Self::from_weights(weights)
    }

    /// The `(length, weight)` points, lengths ascending.
    pub fn points(&self) -> &[(u32, f64)] {
        &self.points
    }

    /// The largest length.
    pub fn max_len(&self) -> u32 {
        self.points.last().map_or(0, |p| p.0)
    }
}

/// How the priority levels are divided between unscheduled and scheduled
/// packets, and the unscheduled cutoffs.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PriorityPlan {
    /// Levels in use (1..=8).
    pub levels: u8,
    /// Highest levels reserved for unscheduled packets.
    pub unsched_priorities: u8,
    /// `cutoffs[i]`: largest message length using the i-th unscheduled level
    /// counting down from the top; only the first `unsched_priorities` are used,
    /// the last used one is `u32::MAX`.
    pub cutoffs: [u32; MAX_PRIORITIES],
    /// Fraction of all message bytes that are unscheduled.
    pub unsched_fraction: f64,
    /// Leading bytes of each message sent unscheduled.
    pub unsched_bytes: u32,
}

impl PriorityPlan {
    /// Computes the plan for `levels` priority levels and `unsched_bytes`
    /// unscheduled bytes per message.
    pub fn compute(sizes: &MessageSizes, unsched_bytes: u32, levels: u8) -> PriorityPlan {
        Self::compute_with(sizes, unsched_bytes, levels, None)
    }

    /// Like [`Self::compute`], but with the number of unscheduled levels
    /// given (clamped to 1..=levels) instead of derived from the byte share.
    pub fn compute_with(
        sizes: &MessageSizes,
        unsched_bytes: u32,
        levels: u8,
        unsched_levels: Option<u8>,
    ) -> PriorityPlan {
        let levels = levels.clamp(1, MAX_PRIORITIES as u8);
        let u = unsched_bytes.max(1) as f64;
        let pts = sizes.points();
        let unsched_of = |len: u32| (len as f64).min(u);
        let total: f64 = pts.iter().map(|&(l, w)| l as f64 * w).sum();
        let unsched_total: f64 = pts.iter().map(|&(l, w)| unsched_of(l) * w).sum();
        let unsched_fraction = if total > 0.0 {
            unsched_total / total
        } else {
            1.0
        };
        // At least one level each way when there are scheduled bytes and more
        // than one level; if (nearly) everything is unscheduled, every level is
        // unscheduled and scheduled packets share the lowest one.
        let share = levels as f64 * unsched_fraction;
        let mut n = share.round() as u8;
        // One unscheduled level for bytes worth more than one level (a
        // share between 1 and 1.5) would put the shortest messages in one
        // class with the unscheduled prefix of every longer message: give
        // them two. With 8 levels no workload of the paper falls here; with
        // 4, W3 does (29.7% of its bytes unscheduled, 1.19 levels), and one
        // unscheduled level made its smallest decile's p99 59% worse than
        // with 8 levels, two leave it within 10% (docs/simulation.md).
        if n == 1 && share > 1.0 && levels >= 3 {
            n = 2;
        }
        n = unsched_levels.unwrap_or(n).clamp(1, levels);
        let mut cutoffs = [u32::MAX; MAX_PRIORITIES];
        // Cutoff k (1..n): the smallest length at which the cumulative
        // unscheduled bytes of messages up to that length reach k/n of the total.
        let mut acc = 0.0;
        let mut k = 1usize;
        for &(len, w) in pts {
            acc += unsched_of(len) * w;
            while k < n as usize && acc >= unsched_total * k as f64 / n as f64 - 1e-12 {
                cutoffs[k - 1] = len;
                k += 1;
            }
        }
        // Levels whose cutoff repeats the previous one carry no bytes; they are
        // harmless (ascending order is kept) and reported as such.
        cutoffs[n as usize - 1] = u32::MAX;
        PriorityPlan {
            levels,
            unsched_priorities: n,
            cutoffs,
            unsched_fraction,
            unsched_bytes,
        }
    }

    /// Writes the plan into an engine configuration. When that changes the
    /// cutoffs the endpoint announces ([`Config::cutoff_table`]), the
    /// configuration's `cutoff_version` moves to the next version, so that
    /// peers holding the old table under the old version adopt the new one.
    pub fn apply(&self, config: &mut Config) {
        let before = config.cutoff_table();
        config.priority_levels = self.levels;
        config.unsched_priorities = self.unsched_priorities;
        config.unsched_cutoffs = self.cutoffs;
        config.unsched_bytes = Some(self.unsched_bytes);
        if config.cutoff_table() != before {
            config.cutoff_version = next_cutoff_version(config.cutoff_version);
        }
    }

    /// Human-readable description, e.g. `8 levels: unscheduled 7..5 cutoffs
    /// [68, 420, max], scheduled 4..0; 93.1% of bytes unscheduled`.
    pub fn describe(&self) -> String {
        let n = self.unsched_priorities as usize;
        let cut: Vec<String> = self.cutoffs[..n]
            .iter()
            .map(|&c| {
                if c == u32::MAX {
                    "max".to_string()
                } else {
                    c.to_string()
                }
            })
            .collect();
        let top = self.levels - 1;
        let low_unsched = self.levels - self.unsched_priorities;
        let sched = if self.unsched_priorities == self.levels {
            "scheduled share level 0".to_string()
        } else {
            format!("scheduled {}..0", low_unsched - 1)
        };
        format!(
            "{} levels: unscheduled {}..{} cutoffs [{}], {}; unscheduled bytes {} ({:.1}% of bytes)",
            self.levels,
            top,
            low_unsched,
            cut.join(", "),
            sched,
            self.unsched_bytes,
            self.unsched_fraction * 100.0
        )
    }
}

/// The version after `v`. Versions stay in 1..=32,767: a new peer entry
/// stores 0 and adopts only versions newer in wrapping 16-bit order
/// (`docs/protocol.md` §3.5), so 32,767 is followed by 1.
pub fn next_cutoff_version(v: u16) -> u16 {
    if v >= i16::MAX as u16 {
        1
    } else {
        v + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(points: &[(u32, f64)]) -> MessageSizes {
        MessageSizes::from_weights(points.iter().copied()).unwrap()
    }

    #[test]
    fn all_unscheduled_distribution_gets_every_level() {
        // Every message fits in the unscheduled bytes.
        let s = sizes(&[(100, 5.0), (1_000, 3.0), (5_000, 1.0)]);
        let p = PriorityPlan::compute(&s, 10_000, 8);
        assert_eq!(p.unsched_fraction, 1.0);
        assert_eq!(p.unsched_priorities, 8);
        assert_eq!(p.cutoffs[7], u32::MAX);
        assert!(p.cutoffs.windows(2).all(|c| c[0] <= c[1]));
        let mut c = Config::default();
        p.apply(&mut c);
        c.validate().unwrap();
    }

    #[test]
    fn large_message_distribution_gets_one_unscheduled_level() {
        let s = sizes(&[(1_000, 1.0), (10_000_000, 1.0)]);
        let p = PriorityPlan::compute(&s, 10_000, 8);
        assert!(p.unsched_fraction < 0.0625, "{}", p.unsched_fraction);
        assert_eq!(p.unsched_priorities, 1);
        assert_eq!(p.cutoffs[0], u32::MAX);
    }

    #[test]
    fn cutoffs_split_unscheduled_bytes_evenly() {
        // 4 equally likely sizes, all fully unscheduled: bytes 100,200,300,400.
        let s = sizes(&[(100, 1.0), (200, 1.0), (300, 1.0), (400, 1.0)]);
        let p = PriorityPlan::compute(&s, 1_000, 2);
        assert_eq!(p.unsched_priorities, 2);
        // Half of 1000 bytes is 500: reached at 300 (100+200+300=600 >= 500).
        assert_eq!(p.cutoffs[..2], [300, u32::MAX]);
        // Sizes weighted so each carries the same bytes: one level each.
        let s = sizes(&[(100, 4.0), (200, 2.0), (400, 1.0)]);
        let p = PriorityPlan::compute(&s, 1_000, 3);
        assert_eq!(p.unsched_priorities, 3);
        assert_eq!(p.cutoffs[..3], [100, 200, u32::MAX]);
    }

    #[test]
    fn share_of_levels_follows_unscheduled_fraction() {
        // Half the bytes unscheduled: 1000-byte messages (all unscheduled) and
        // 10_000-byte messages with 1000 unscheduled, weighted to equal bytes.
        let s = sizes(&[(1_000, 9.0), (10_000, 1.0)]);
        let p = PriorityPlan::compute(&s, 1_000, 8);
        // bytes: 9000 unscheduled from small, 1000 of 10000 from large => 10000/19000.
        assert!((p.unsched_fraction - 10.0 / 19.0).abs() < 1e-9);
        assert_eq!(p.unsched_priorities, 4);
        let p1 = PriorityPlan::compute(&s, 1_000, 1);
        assert_eq!(
            (p1.levels, p1.unsched_priorities, p1.cutoffs[0]),
            (1, 1, u32::MAX)
        );
        let mut c = Config::default();
        p1.apply(&mut c);
        c.validate().unwrap();
    }

    #[test]
    fn unscheduled_bytes_worth_more_than_one_level_get_two() {
        // 30% of the bytes unscheduled (W3-like): 8 levels give 2.4 -> 2;
        // 4 levels give 1.2, which rounds to 1 but gets 2; 2 levels keep 1
        // (one must stay scheduled).
        let s = sizes(&[(1_000, 20.0), (10_000, 7.0)]);
        let p = PriorityPlan::compute(&s, 1_000, 8);
        assert!((p.unsched_fraction - 0.3).abs() < 1e-9);
        assert_eq!(p.unsched_priorities, 2);
        assert_eq!(PriorityPlan::compute(&s, 1_000, 4).unsched_priorities, 2);
        assert_eq!(PriorityPlan::compute(&s, 1_000, 2).unsched_priorities, 1);
        // Below one level's worth, one level stays one.
        let small = sizes(&[(1_000, 1.0), (10_000, 7.0)]);
        assert_eq!(
            PriorityPlan::compute(&small, 1_000, 4).unsched_priorities,
            1
        );
    }

    #[test]
    fn unscheduled_levels_can_be_forced() {
        let s = sizes(&[(100, 10.0), (1_000, 5.0), (100_000, 1.0)]);
        assert_eq!(PriorityPlan::compute(&s, 8496, 4).unsched_priorities, 1);
        let p = PriorityPlan::compute_with(&s, 8496, 4, Some(2));
        assert_eq!(p.unsched_priorities, 2);
        assert!(p.cutoffs[0] < u32::MAX && p.cutoffs[1] == u32::MAX);
        assert_eq!(
            PriorityPlan::compute_with(&s, 8496, 4, Some(9)).unsched_priorities,
            4
        );
    }

    #[test]
    fn applying_new_cutoffs_bumps_the_version_and_the_same_ones_do_not() {
        let s = sizes(&[(100, 4.0), (200, 2.0), (400, 1.0)]);
        let p = PriorityPlan::compute(&s, 1_000, 3);
        let mut c = Config::default();
        assert_eq!(c.cutoff_version, 1);
        p.apply(&mut c);
        assert_eq!(c.cutoff_version, 2, "new cutoffs need a new version");
        p.apply(&mut c);
        assert_eq!(c.cutoff_version, 2, "the same table keeps its version");
        // Only the number of levels changes: the table does, so the version too.
        let mut q = p.clone();
        q.levels = 4;
        q.apply(&mut c);
        assert_eq!(c.cutoff_version, 3);
        // Cutoffs beyond the used ones are not announced: no new version.
        let mut r = q.clone();
        r.cutoffs[5] = 7;
        r.apply(&mut c);
        assert_eq!(c.cutoff_version, 3);
        c.validate().unwrap();
    }

    #[test]
    fn versions_stay_where_new_peers_adopt_them() {
        assert_eq!(next_cutoff_version(1), 2);
        assert_eq!(next_cutoff_version(32_766), 32_767);
        assert_eq!(next_cutoff_version(32_767), 1);
        assert_eq!(next_cutoff_version(u16::MAX), 1);
    }

    #[test]
    fn distributions_from_weights_and_from_a_cdf_agree() {
        let w =
            MessageSizes::from_weights([(300, 0.25), (100, 0.5), (0, 0.0), (200, 0.25)]).unwrap();
        assert_eq!(w.points(), &[(100, 0.5), (200, 0.25), (300, 0.25)]);
        assert_eq!(w.max_len(), 300);
        let c = MessageSizes::from_cdf(&[(100, 0.5), (200, 0.75), (300, 1.0)]).unwrap();
        assert_eq!(c, w);
        assert!(MessageSizes::from_cdf(&[(100, 0.5), (100, 1.0)]).is_err());
        assert!(MessageSizes::from_cdf(&[(100, 0.5), (200, 0.4)]).is_err());
        assert!(MessageSizes::from_weights([(100, 0.0)]).is_err());
        assert!(MessageSizes::from_weights([(100, f64::NAN)]).is_err());
    }
}
