//! `rpc-bench --breakdown` runs end to end (its own process: the time
//! trace is global, and other tests must not enable, clear or fill it
//! meanwhile).

use homa_bench::rpc::{measure_breakdown, print_breakdown};

#[test]
fn a_small_breakdown_runs() {
    // Timing is not asserted (a loaded machine may stretch any step); only
    // that traced windows were found and cut by both plans.
    let r = measure_breakdown(&homa_bench::loopback_config(), 100, 40, Some(40)).unwrap();
    for c in [Some(&r.null), r.nested.as_ref()].into_iter().flatten() {
        let bd = &c.breakdown;
        assert_eq!(bd.rpcs + bd.incomplete, 40);
        assert!(bd.rpcs > 0, "no complete window: {:?}", bd.missed);
        assert!(bd.sum_ns() > 0.0);
    }
    assert!(r.record_cost_ns > 0.0);
    print_breakdown(&r, true);
}
