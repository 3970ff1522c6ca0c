//! The unscheduled priority plan is the engine's
//! ([`homa_proto::priorities`]); this module turns a [`Workload`] into the
//! engine's [`MessageSizes`] and checks the plan on the built-in workloads.

use crate::workload::Workload;
pub use homa_proto::priorities::{MessageSizes, PriorityPlan};

/// The workload's sizes as the engine takes them (the same points and
/// weights).
pub fn message_sizes(workload: &Workload) -> MessageSizes {
    workload.message_sizes()
}

/// The engine's own tests of the plan use small distributions; these run it
/// on the built-in workloads.
#[cfg(test)]
mod tests {
    use super::*;
    use homa_proto::Config;

    fn plan(w: &Workload, unsched: u32, levels: u8) -> PriorityPlan {
        PriorityPlan::compute(&message_sizes(w), unsched, levels)
    }

    #[test]
    fn all_unscheduled_workload_gets_every_level() {
        // W1: nearly every byte is in messages below ~10 KB.
        let w = Workload::builtin("w1").unwrap();
        let p = plan(&w, 10_000, 8);
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
        let p = plan(&w, 10_000, 8);
        assert!(p.unsched_fraction < 0.0625, "{}", p.unsched_fraction);
        assert_eq!(p.unsched_priorities, 1);
        assert_eq!(p.cutoffs[0], u32::MAX);
    }

    #[test]
    fn unscheduled_levels_can_be_forced() {
        let w = Workload::builtin("w3").unwrap();
        // Derived: 1.1 levels' worth of unscheduled bytes get two levels.
        let p = plan(&w, 8496, 4);
        assert_eq!(p.unsched_priorities, 2);
        assert!(p.cutoffs[0] < u32::MAX && p.cutoffs[1] == u32::MAX);
        // Forced below and above the derived count.
        let p = PriorityPlan::compute_with(&message_sizes(&w), 8496, 4, Some(1));
        assert_eq!(p.unsched_priorities, 1);
        assert_eq!(p.cutoffs[0], u32::MAX);
        assert_eq!(
            PriorityPlan::compute_with(&message_sizes(&w), 8496, 4, Some(9)).unsched_priorities,
            4
        );
    }

    #[test]
    fn every_builtin_plan_is_a_valid_config() {
        for name in crate::workload::BUILTIN {
            let w = Workload::builtin(name).unwrap();
            for levels in [1, 2, 4, 8] {
                let p = plan(&w, 9_700, levels);
                let mut c = Config::default();
                p.apply(&mut c);
                c.validate().unwrap();
                assert!(!p.describe().is_empty());
            }
        }
    }
}
