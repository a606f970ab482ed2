//! Guards the update path when the tail's `Committed` notice is lost (the head answers a
//! front-end's successful update with nothing but that notice): both front-ends drop every
//! third notice they receive (`--fault-drop-notice-every 3`), so a third of the updates
//! must fall back to asking the head again with the same request id. 16 clients (native, and
//! memcached through both front-ends) run gets, gets + cas, sets and deletes on a few
//! hot keys. The history must be linearizable (a fallback that applied an update twice, or
//! answered before the tail had it, shows there), the final scan must find every
//! acknowledged write, the front-ends must have taken the fallback (and received more notices
//! than fallbacks), and no operation may be left with an unknown outcome.
//! Seeds: FAWN_SEED (one or a comma-separated list), else the default below.

mod common;

use common::history::{run_scenario, Scenario};

#[test]
fn updates_whose_notice_is_lost_are_answered_once() {
    let mut sc = Scenario::new("faults_lost_notices");
    sc.shape.frontends = 2;
    sc.shape.frontend_args.extend(["--fault-drop-notice-every".to_string(), "3".to_string()]);
    sc.workload.think = std::time::Duration::ZERO;
    let reports = run_scenario(&sc, &[131], |f| {
        f.note("every third Committed notice dropped at both front-ends");
        f.pause_ms(8_000, 8_001);
        let fallbacks = f.procs.frontend_counter_sum("notice_timeouts");
        let notices = f.procs.frontend_counter_sum("committed_notices");
        f.note(format!("{fallbacks} updates fell back to the head; {notices} notices received"));
        assert!(fallbacks > 0, "no update fell back to asking the head ({notices} notices received)");
        // Two notices in three get through: the fallback must be the exception.
        assert!(
            notices > fallbacks,
            "{notices} notices received for {fallbacks} fallbacks: notices do not arrive"
        );
    });
    // Nothing else fails, so every operation must finish: an update whose fallback never
    // answers would be left unknown.
    for r in reports {
        eprintln!("seed {}: {} operations, {} unknown, {} failed", r.seed, r.operations, r.unknown, r.failed);
        assert_eq!(r.unknown, 0, "seed {}: operations left with an unknown outcome", r.seed);
    }
}
