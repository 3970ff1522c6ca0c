//! Unscheduled priority allocation computed from the workload, as in the Homa
//! paper: the unscheduled levels get a share of the available levels in
//! proportion to the fraction of bytes that are sent unscheduled, and the
//! cutoffs between unscheduled levels split the unscheduled bytes evenly.

use crate::workload::Workload;
use homa_proto::wire::MAX_PRIORITIES;
use homa_proto::Config;
use serde::Serialize;

/// How the priority levels are divided between unscheduled and scheduled
/// packets, and the unscheduled cutoffs.
#[derive(Clone, Debug, PartialEq, Serialize)]
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
    pub fn compute(workload: &Workload, unsched_bytes: u32, levels: u8) -> PriorityPlan {
        Self::compute_with(workload, unsched_bytes, levels, None)
    }

    /// Like [`Self::compute`], but with the number of unscheduled levels
    /// given (clamped to 1..=levels) instead of derived from the byte share.
    pub fn compute_with(
        workload: &Workload,
        unsched_bytes: u32,
        levels: u8,
        unsched_levels: Option<u8>,
    ) -> PriorityPlan {
        let levels = levels.clamp(1, MAX_PRIORITIES as u8);
        let u = unsched_bytes.max(1) as f64;
        let pts = workload.points();
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
        let mut n = (levels as f64 * unsched_fraction).round() as u8;
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

    /// Writes the plan into an engine configuration.
    pub fn apply(&self, config: &mut Config) {
        config.priority_levels = self.levels;
        config.unsched_priorities = self.unsched_priorities;
        config.unsched_cutoffs = self.cutoffs;
        config.unsched_bytes = Some(self.unsched_bytes);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_unscheduled_workload_gets_every_level() {
        // W1: nearly every byte is in messages below ~10 KB.
        let w = Workload::builtin("w1").unwrap();
        let p = PriorityPlan::compute(&w, 10_000, 8);
        assert!(p.unsched_fraction > 0.93, "{}", p.unsched_fraction);
        assert_eq!(p.unsched_priorities, 8);
        assert_eq!(p.cutoffs[7], u32::MAX);
        assert!(p.cutoffs.windows(2).all(|c| c[0] <= c[1]));
        let mut c = Config::default();
        p.apply(&mut c);
        c.validate().unwrap();
    }

    #[test]
    fn large_message_workload_gets_one_unscheduled_level() {
        let w = Workload::builtin("w5").unwrap();
        let p = PriorityPlan::compute(&w, 10_000, 8);
        assert!(p.unsched_fraction < 0.0625, "{}", p.unsched_fraction);
        assert_eq!(p.unsched_priorities, 1);
        assert_eq!(p.cutoffs[0], u32::MAX);
    }

    #[test]
    fn cutoffs_split_unscheduled_bytes_evenly() {
        // 4 equally likely sizes, all fully unscheduled: bytes 100,200,300,400.
        let w = Workload::from_points(
            "t".into(),
            vec![(100, 1.0), (200, 1.0), (300, 1.0), (400, 1.0)],
        )
        .unwrap();
        let p = PriorityPlan::compute(&w, 1_000, 2);
        assert_eq!(p.unsched_priorities, 2);
        // Half of 1000 bytes is 500: reached at 300 (100+200+300=600 >= 500).
        assert_eq!(p.cutoffs[..2], [300, u32::MAX]);
        // Sizes weighted so each carries the same bytes: one level each.
        let w =
            Workload::from_points("t".into(), vec![(100, 4.0), (200, 2.0), (400, 1.0)]).unwrap();
        let p = PriorityPlan::compute(&w, 1_000, 3);
        assert_eq!(p.unsched_priorities, 3);
        assert_eq!(p.cutoffs[..3], [100, 200, u32::MAX]);
    }

    #[test]
    fn share_of_levels_follows_unscheduled_fraction() {
        // Half the bytes unscheduled: 1000-byte messages (all unscheduled) and
        // 10_000-byte messages with 1000 unscheduled, weighted to equal bytes.
        let w = Workload::from_points("t".into(), vec![(1_000, 9.0), (10_000, 1.0)]).unwrap();
        let p = PriorityPlan::compute(&w, 1_000, 8);
        // bytes: 9000 unscheduled from small, 1000 of 10000 from large => 10000/19000.
        assert!((p.unsched_fraction - 10.0 / 19.0).abs() < 1e-9);
        assert_eq!(p.unsched_priorities, 4);
        let p1 = PriorityPlan::compute(&w, 1_000, 1);
        assert_eq!(
            (p1.levels, p1.unsched_priorities, p1.cutoffs[0]),
            (1, 1, u32::MAX)
        );
        let mut c = Config::default();
        p1.apply(&mut c);
        c.validate().unwrap();
    }

    #[test]
    fn unscheduled_levels_can_be_forced() {
        let w = Workload::builtin("w3").unwrap();
        assert_eq!(PriorityPlan::compute(&w, 8496, 4).unsched_priorities, 1);
        let p = PriorityPlan::compute_with(&w, 8496, 4, Some(2));
        assert_eq!(p.unsched_priorities, 2);
        assert!(p.cutoffs[0] < u32::MAX && p.cutoffs[1] == u32::MAX);
        assert_eq!(
            PriorityPlan::compute_with(&w, 8496, 4, Some(9)).unsched_priorities,
            4
        );
    }

    #[test]
    fn every_builtin_plan_is_a_valid_config() {
        for name in crate::workload::BUILTIN {
            let w = Workload::builtin(name).unwrap();
            for levels in [1, 2, 4, 8] {
                let p = PriorityPlan::compute(&w, 9_700, levels);
                let mut c = Config::default();
                p.apply(&mut c);
                c.validate().unwrap();
                assert!(!p.describe().is_empty());
            }
        }
    }
}
