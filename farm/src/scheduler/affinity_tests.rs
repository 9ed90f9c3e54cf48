//! Cache affinity on virtual time: a task goes to the free worker that lacks
//! the fewest bytes of its job's assets; with affinity off, to whoever's turn
//! it is. Cases are data: (held per worker, job assets, slots) → who gets
//! which tasks.

use super::*;

/// A scheduler with plain settings (the one place that names them).
fn scheduler() -> Scheduler {
    Scheduler::new(Config {
        lease_ms: 1_000,
        max_attempts: 3,
        first_epoch: 1,
        retry_backoff_ms: 0,
        straggler_percent: 0,
    })
}

fn d(n: u8) -> Digest {
    Digest::of(&[n])
}

/// Two workers (1 and 2) with `slots` each; worker 1 holds `held1`, worker 2
/// `held2`; one job of `tasks` tasks needing assets 1..=3 of 100, 100 and
/// 1000 bytes. Returns the workers given tasks, in order.
fn check(
    held1: &[u8],
    held2: &[u8],
    slots: u32,
    tasks: u32,
    affinity: bool,
    expected: &[WorkerId],
) {
    let mut s = scheduler();
    s.set_affinity(affinity);
    for w in [1, 2] {
        s.add_worker(w, slots, vec!["builtin".into()], 0);
    }
    let held = |h: &[u8]| h.iter().map(|&n| d(n)).collect::<Vec<_>>();
    s.worker_holds(1, &held(held1), &[]);
    s.worker_holds(2, &held(held2), &[]);
    s.add_job(
        NewJob {
            id: 7,
            priority: 0,
            submit_seq: 1,
            engine: "builtin".into(),
            pending: (0..tasks).collect(),
            total: tasks,
        },
        0,
    );
    s.set_job_assets(7, vec![(d(1), 100), (d(2), 100), (d(3), 1000)]);
    let given: Vec<WorkerId> = s.assign(0).iter().map(|a| a.worker).collect();
    assert_eq!(
        given, expected,
        "held {held1:?} / {held2:?}, {slots} slots, {tasks} tasks, affinity {affinity}"
    );
}

#[test]
fn tasks_go_to_the_worker_holding_their_assets() {
    // One task: worker 2 holds the big asset; its turn would be second.
    check(&[], &[3], 1, 1, true, &[2]);
    check(&[], &[3], 1, 1, false, &[1]);
    // Worker 1 lacks 1000 bytes, worker 2 lacks 100: 2 first, then the rest
    // spreads as usual (nobody idles while work waits).
    check(&[1, 2], &[2, 3], 2, 3, true, &[2, 2, 1]);
    check(&[1, 2], &[2, 3], 2, 3, false, &[1, 2, 1]);
    // Equal holdings: the usual turns.
    check(&[3], &[3], 1, 2, true, &[1, 2]);
}

#[test]
fn what_a_worker_holds_follows_its_reports() {
    let mut s = scheduler();
    s.worker_holds(1, &[d(1), d(2)], &[]);
    s.set_job_assets(9, vec![(d(1), 10), (d(2), 20), (d(3), 30)]);
    assert_eq!(s.affinity.missing(9, 1), 30);
    s.worker_holds(1, &[d(3)], &[d(1)]);
    assert_eq!(s.affinity.missing(9, 1), 10);
    assert_eq!(s.affinity.missing(9, 2), 60);
    s.remove_worker(1, 0);
    assert_eq!(s.affinity.missing(9, 1), 60);
}

#[test]
fn what_a_worker_claims_to_hold_is_bounded() {
    let mut s = scheduler();
    // Two million claimed digests, in batches: at most MAX_CACHED_DIGESTS kept.
    for batch in 0..20u32 {
        let claimed: Vec<Digest> = (0..100_000u32)
            .map(|i| Digest::of(&(batch * 100_000 + i).to_le_bytes()))
            .collect();
        s.worker_holds(1, &claimed, &[]);
    }
    assert_eq!(s.held_count(1), MAX_CACHED_DIGESTS);
}
