//! Deterministic simulation tests for the scheduler core.
//!
//! A [`Farm`] drives one [`Scheduler`] on virtual time with fake workers that
//! are nothing but ids. Each feature has one `check_*` helper taking the
//! situation and the expected outcome as plain data; the randomized
//! simulation at the end runs many workers joining, dying and finishing work
//! under a seeded PRNG and checks that every task ends done exactly once.

use std::collections::{BTreeMap, HashSet};

use super::results::collect_errors;
use super::*;

const LEASE: Millis = 1_000;

fn key(job: JobId, index: u32) -> TaskKey {
    TaskKey { job, index }
}

/// A job as test data: id, priority, engine, number of tasks.
type JobSpec = (JobId, i32, &'static str, u32);
/// A worker as test data: id, slots, engines.
type WorkerSpec = (WorkerId, u32, &'static [&'static str]);
/// An assignment as test data: worker, job, task index.
type Given = (WorkerId, JobId, u32);

/// The scheduler settings most tests use; others change a field or two.
fn config() -> Config {
    Config {
        lease_ms: LEASE,
        max_attempts: 3,
        first_epoch: 1,
        retry_backoff_ms: 0,
        straggler_percent: 0,
    }
}

/// One scheduler on virtual time.
struct Farm {
    sched: Scheduler,
    now: Millis,
    next_seq: u64,
}

impl Farm {
    fn new() -> Farm {
        Farm::with(config())
    }

    fn with(config: Config) -> Farm {
        Farm {
            sched: Scheduler::new(config),
            now: 0,
            next_seq: 0,
        }
    }

    /// Submits a job whose tasks are all pending; submission order is call order.
    fn job(&mut self, (id, priority, engine, tasks): JobSpec) {
        self.next_seq += 1;
        let job = NewJob {
            id,
            priority,
            submit_seq: self.next_seq,
            engine: engine.to_string(),
            pending: (0..tasks).collect(),
            total: tasks,
        };
        self.sched.add_job(job, self.now);
    }

    fn worker(&mut self, (id, slots, engines): WorkerSpec) {
        let engines = engines.iter().map(|e| e.to_string()).collect();
        self.sched.add_worker(id, slots, engines, self.now);
    }

    fn at(&mut self, now: Millis) -> &mut Farm {
        assert!(now >= self.now, "virtual time runs forward");
        self.now = now;
        self
    }

    fn assign(&mut self) -> Vec<Given> {
        let given = self.sched.assign(self.now);
        given
            .iter()
            .map(|a| (a.worker, a.task.job, a.task.index))
            .collect()
    }

    fn epoch(&self, worker: WorkerId, task: TaskKey) -> Epoch {
        let running = self.sched.running_on(worker);
        let found = running.iter().find(|(t, _)| *t == task);
        found
            .unwrap_or_else(|| panic!("worker {worker} does not run {task}"))
            .1
    }

    /// Completes a task with the epoch its worker currently holds.
    fn complete(&mut self, worker: WorkerId, task: TaskKey) -> Result<Accepted, Refused> {
        let epoch = self.epoch(worker, task);
        self.sched.complete(worker, task, epoch, self.now)
    }

    fn fail(
        &mut self,
        worker: WorkerId,
        task: TaskKey,
        error: &str,
    ) -> Result<FailOutcome, Refused> {
        let epoch = self.epoch(worker, task);
        self.sched
            .fail(worker, task, epoch, error.to_string(), self.now)
    }

    fn progress(&self, job: JobId) -> (u32, u32, u32, u32) {
        let p = self.sched.job_progress(job).expect("known job");
        (p.total, p.done, p.running, p.queued)
    }

    /// Everything observable, to show that a refusal changed nothing.
    fn snapshot(&self, jobs: &[JobId], workers: &[WorkerId]) -> String {
        let s = &self.sched;
        let jobs: Vec<_> = jobs
            .iter()
            .map(|&j| (s.job_state(j), s.job_progress(j)))
            .collect();
        let workers: Vec<_> = workers.iter().map(|&w| s.running_on(w)).collect();
        format!(
            "{jobs:?} {workers:?} {:?} {}",
            s.next_deadline(),
            s.next_epoch()
        )
    }
}

// ---- assign ----

#[track_caller]
fn check_assign(jobs: &[JobSpec], workers: &[WorkerSpec], expected: &[Given]) {
    let mut farm = Farm::new();
    jobs.iter().for_each(|&job| farm.job(job));
    workers.iter().for_each(|&worker| farm.worker(worker));
    assert_eq!(farm.assign(), expected);
    assert_eq!(farm.assign(), [], "a second call finds nothing more to do");
}

/// The case: a worker claiming 256 slots (100,000, capped) beside
/// an honest one-slot worker, on a 16-task job. Its claim is filled only as
/// far as it has proven it: `TRUSTED_SLOTS` at first, one more per result
/// it delivers, so the honest worker renders the rest instead of idling.
#[test]
fn a_huge_slot_claim_is_filled_only_as_far_as_it_is_proven() {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 16));
    farm.worker((10, 256, &["builtin"]));
    farm.worker((11, 1, &["builtin"]));
    let given = farm.assign();
    let greedy = given.iter().filter(|g| g.0 == 10).count() as u32;
    assert_eq!(greedy, TRUSTED_SLOTS, "{given:?}");
    assert_eq!(given.iter().filter(|g| g.0 == 11).count(), 1, "{given:?}");
    // The greedy worker never delivers: the honest one renders every other
    // task, one at a time.
    for _ in 0..(16 - TRUSTED_SLOTS) {
        let (_, job, index) = *farm
            .sched
            .running_on(11)
            .iter()
            .map(|(t, _)| (11, t.job, t.index))
            .collect::<Vec<_>>()
            .first()
            .expect("the honest worker holds a task");
        farm.complete(11, key(job, index)).unwrap();
        let given = farm.assign();
        assert!(
            given.iter().all(|g| g.0 == 11),
            "the greedy worker got more: {given:?}"
        );
    }
    assert_eq!(farm.sched.running_on(10).len() as u32, TRUSTED_SLOTS);
    // A worker that delivers is trusted with one more slot per result.
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 16));
    farm.worker((10, 256, &["builtin"]));
    assert_eq!(farm.assign().len() as u32, TRUSTED_SLOTS);
    farm.complete(10, key(1, 0)).unwrap();
    farm.complete(10, key(1, 1)).unwrap();
    assert_eq!(farm.assign().len(), 4, "two results earn two more slots");
    assert_eq!(farm.sched.usable_slots(10), TRUSTED_SLOTS + 2);
}

/// A result kept aside to be checked: its lease ends without the task
/// being done, and the task goes to no worker of the tag that rendered it.
#[test]
fn a_released_task_is_excluded_for_the_tag_that_rendered_it() {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 1));
    farm.worker((10, 1, &["builtin"]));
    farm.worker((12, 1, &["builtin"]));
    farm.sched.set_worker_tag(12, 10);
    assert_eq!(farm.assign(), [(10, 1, 0)]);
    let epoch = farm.epoch(10, key(1, 0));
    farm.sched.release(10, key(1, 0), epoch, farm.now).unwrap();
    farm.sched.exclude(key(1, 0), 10);
    assert_eq!(farm.assign(), [], "worker 12 has the same tag");
    assert_eq!(farm.progress(1), (1, 0, 0, 1));
    farm.worker((11, 1, &["builtin"]));
    assert_eq!(farm.assign(), [(11, 1, 0)]);
    farm.complete(11, key(1, 0)).unwrap();
    assert!(farm.sched.reopen(key(1, 0)), "a done task can be reopened");
    assert_eq!(farm.progress(1), (1, 0, 0, 1));
    assert_eq!(farm.assign(), [(11, 1, 0)]);
}

#[test]
fn assign_orders_by_priority_then_submission_then_index() {
    check_assign(
        &[
            (1, 0, "builtin", 2),
            (2, 5, "builtin", 2),
            (3, 5, "builtin", 1),
        ],
        &[(10, 4, &["builtin"])],
        &[(10, 2, 0), (10, 2, 1), (10, 3, 0), (10, 1, 0)],
    );
    // Submission order, not job id, breaks a priority tie.
    check_assign(
        &[(9, 0, "builtin", 1), (4, 0, "builtin", 1)],
        &[(10, 2, &["builtin"])],
        &[(10, 9, 0), (10, 4, 0)],
    );
    // Pending tasks go out in index order whatever order they were given in.
    let mut farm = Farm::new();
    let job = NewJob {
        id: 1,
        priority: 0,
        submit_seq: 0,
        engine: "builtin".into(),
        pending: vec![7, 2, 5, 2, 99],
        total: 8,
    };
    farm.sched.add_job(job, 0);
    farm.worker((10, 4, &["builtin"]));
    assert_eq!(farm.assign(), [(10, 1, 2), (10, 1, 5), (10, 1, 7)]);
    assert_eq!(farm.progress(1), (8, 5, 3, 0));
}

#[test]
fn assign_fills_slots_and_no_more() {
    check_assign(
        &[(1, 0, "builtin", 10)],
        &[
            (10, 1, &["builtin"]),
            (11, 2, &["builtin"]),
            (12, 0, &["builtin"]),
        ],
        &[(10, 1, 0), (11, 1, 1), (11, 1, 2)],
    );
    check_assign(&[], &[(10, 4, &["builtin"])], &[]);
    check_assign(&[(1, 0, "builtin", 3)], &[], &[]);
}

#[test]
fn assign_filters_by_engine() {
    check_assign(
        &[(1, 0, "unreal", 2)],
        &[(10, 2, &["blender", "builtin"])],
        &[],
    );
    check_assign(
        &[
            (1, 9, "unreal", 1),
            (2, 0, "blender", 2),
            (3, 5, "builtin", 2),
        ],
        &[(10, 2, &["blender"]), (11, 3, &["builtin", "unreal"])],
        &[(10, 2, 0), (11, 1, 0), (10, 2, 1), (11, 3, 0), (11, 3, 1)],
    );
}

#[test]
fn assign_spreads_work_over_workers() {
    check_assign(
        &[(1, 0, "builtin", 3)],
        &[
            (10, 4, &["builtin"]),
            (11, 4, &["builtin"]),
            (12, 4, &["builtin"]),
        ],
        &[(10, 1, 0), (11, 1, 1), (12, 1, 2)],
    );
    check_assign(
        &[(1, 0, "builtin", 5)],
        &[(10, 4, &["builtin"]), (11, 2, &["builtin"])],
        &[(10, 1, 0), (11, 1, 1), (10, 1, 2), (11, 1, 3), (10, 1, 4)],
    );
}

#[test]
fn assign_takes_turns_across_calls() {
    let mut farm = Farm::new();
    farm.worker((10, 4, &["builtin"]));
    farm.worker((11, 4, &["builtin"]));
    farm.worker((12, 4, &["builtin"]));
    let mut given = Vec::new();
    for job in 1..=5 {
        farm.job((job, 0, "builtin", 1));
        given.extend(farm.assign());
    }
    assert_eq!(
        given,
        [(10, 1, 0), (11, 2, 0), (12, 3, 0), (10, 4, 0), (11, 5, 0)]
    );
}

// ---- complete ----

#[test]
fn complete_marks_each_task_done_once_and_finishes_the_job() {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 2));
    farm.worker((10, 2, &["builtin"]));
    assert_eq!(farm.sched.job_state(1), Some(JobState::Queued));
    farm.assign();
    assert_eq!(farm.sched.job_state(1), Some(JobState::Running));
    assert_eq!(farm.progress(1), (2, 0, 2, 0));

    let epoch = farm.epoch(10, key(1, 0));
    assert_eq!(
        farm.complete(10, key(1, 0)),
        Ok(Accepted::TaskDone { job_done: false })
    );
    let before = farm.snapshot(&[1], &[10]);
    assert_eq!(
        farm.sched.complete(10, key(1, 0), epoch, 0),
        Err(Refused::AlreadyDone { task: key(1, 0) })
    );
    assert_eq!(
        farm.snapshot(&[1], &[10]),
        before,
        "a duplicate result changes nothing"
    );

    assert_eq!(
        farm.complete(10, key(1, 1)),
        Ok(Accepted::TaskDone { job_done: true })
    );
    assert_eq!(farm.sched.job_state(1), Some(JobState::Done));
    assert_eq!(farm.progress(1), (2, 2, 0, 0));
    assert_eq!(farm.sched.next_deadline(), None);
}

#[test]
fn job_with_nothing_pending_is_done_at_once() {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 0));
    let resumed = NewJob {
        id: 2,
        priority: 0,
        submit_seq: 9,
        engine: "builtin".into(),
        pending: vec![],
        total: 4,
    };
    farm.sched.add_job(resumed, 0);
    farm.worker((10, 1, &["builtin"]));
    assert_eq!(farm.assign(), []);
    assert_eq!(farm.sched.job_state(1), Some(JobState::Done));
    assert_eq!(farm.sched.job_state(2), Some(JobState::Done));
    assert_eq!(farm.progress(2), (4, 4, 0, 0));
    assert_eq!(farm.sched.job_state(3), None);
}

#[test]
fn adding_a_known_job_again_changes_nothing() {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 2));
    farm.worker((10, 1, &["builtin"]));
    farm.assign();
    let before = farm.snapshot(&[1], &[10]);
    farm.job((1, 7, "builtin", 50));
    assert_eq!(farm.snapshot(&[1], &[10]), before);
}

// ---- refusals ----

/// Job 1 has three tasks: task 0 leased to worker 10 (epoch 1), task 1 to
/// worker 11 (epoch 2), task 2 queued. A result from `worker` for `task` under
/// `epoch` must be refused as `expected`, by both `complete` and `fail`, and
/// change nothing.
#[track_caller]
fn check_refused(worker: WorkerId, task: TaskKey, epoch: u64, expected: Refused) {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 3));
    farm.worker((10, 1, &["builtin"]));
    farm.worker((11, 1, &["builtin"]));
    assert_eq!(farm.assign(), [(10, 1, 0), (11, 1, 1)]);
    let before = farm.snapshot(&[1], &[10, 11]);
    let refused = farm.sched.complete(worker, task, Epoch(epoch), 5);
    assert_eq!(refused, Err(expected.clone()));
    let refused = farm
        .sched
        .fail(worker, task, Epoch(epoch), "boom".into(), 5);
    assert_eq!(refused, Err(expected));
    assert_eq!(
        farm.snapshot(&[1], &[10, 11]),
        before,
        "a refusal changes nothing"
    );
}

#[test]
fn results_without_the_current_lease_are_refused() {
    let not_holder = Refused::NotLeasedToWorker {
        task: key(1, 0),
        worker: 11,
        holder: 10,
    };
    check_refused(11, key(1, 0), 1, not_holder);
    let wrong_epoch = Refused::StaleEpoch {
        task: key(1, 0),
        epoch: Epoch(2),
        current: Some(Epoch(1)),
    };
    check_refused(10, key(1, 0), 2, wrong_epoch);
    let queued = Refused::StaleEpoch {
        task: key(1, 2),
        epoch: Epoch(1),
        current: None,
    };
    check_refused(10, key(1, 2), 1, queued);
    check_refused(10, key(2, 0), 1, Refused::UnknownTask { task: key(2, 0) });
    check_refused(10, key(1, 3), 1, Refused::UnknownTask { task: key(1, 3) });
}

#[test]
fn refusals_say_what_happened() {
    let stale = Refused::StaleEpoch {
        task: key(7, 3),
        epoch: Epoch(12),
        current: Some(Epoch(15)),
    };
    assert_eq!(
        stale.to_string(),
        "result for task 3 of job 7 carries lease epoch 12, but the task was handed out again \
         under epoch 15; drop this result"
    );
    let failed = Refused::JobNotRunning {
        job: 7,
        state: JobState::Failed("blender crashed".into()),
    };
    assert_eq!(
        failed.to_string(),
        "job 7 is failed (blender crashed); its results are no longer wanted"
    );
}

// ---- leases: expiry, heartbeat, requeue ----

/// A worker leases one task at time 0, heartbeats at `heartbeats`; the lease
/// must be alive just before `deadline` and expired at it.
#[track_caller]
fn check_lease_deadline(heartbeats: &[Millis], deadline: Millis) {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 1));
    farm.worker((10, 1, &["builtin"]));
    farm.assign();
    for &t in heartbeats {
        assert_eq!(farm.at(t).sched.expire(t), [], "alive at heartbeat {t}");
        farm.sched.heartbeat(10, t);
    }
    assert_eq!(farm.sched.next_deadline(), Some(deadline));
    assert_eq!(farm.at(deadline - 1).sched.expire(deadline - 1), []);
    assert_eq!(farm.progress(1), (1, 0, 1, 0));
    let expired = farm.at(deadline).sched.expire(deadline);
    let lease = Assignment {
        worker: 10,
        task: key(1, 0),
        epoch: Epoch(1),
    };
    assert_eq!(expired, [lease]);
    assert_eq!(farm.progress(1), (1, 0, 0, 1));
    assert_eq!(farm.sched.running_on(10), []);
    assert_eq!(farm.sched.next_deadline(), None);
}

#[test]
fn lease_expires_lease_ms_after_its_last_renewal() {
    check_lease_deadline(&[], LEASE);
    check_lease_deadline(&[600], 600 + LEASE);
    check_lease_deadline(&[600, 1500, 2400], 2400 + LEASE);
    check_lease_deadline(&[0, 0], LEASE);
}

#[test]
fn heartbeat_renews_only_that_workers_leases() {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 2));
    farm.worker((10, 1, &["builtin"]));
    farm.worker((11, 1, &["builtin"]));
    farm.assign();
    farm.at(800).sched.heartbeat(11, 800);
    farm.sched.heartbeat(99, 800);
    let expired = farm.at(LEASE).sched.expire(LEASE);
    assert_eq!(expired.iter().map(|a| a.worker).collect::<Vec<_>>(), [10]);
    assert_eq!(farm.sched.next_deadline(), Some(800 + LEASE));
}

#[test]
fn expired_task_goes_to_another_worker_and_the_late_result_is_refused() {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 1));
    farm.worker((10, 1, &["builtin"]));
    assert_eq!(farm.assign(), [(10, 1, 0)]);
    let old = farm.epoch(10, key(1, 0));
    farm.at(500).worker((11, 1, &["builtin"]));
    assert_eq!(farm.assign(), []);

    // Worker 10 goes silent; its lease runs out.
    assert_eq!(farm.at(LEASE).sched.expire(LEASE).len(), 1);
    let stale_before_reassign = farm.sched.complete(10, key(1, 0), old, LEASE);
    let expected = Refused::StaleEpoch {
        task: key(1, 0),
        epoch: old,
        current: None,
    };
    assert_eq!(stale_before_reassign, Err(expected));
    assert_eq!(farm.assign(), [(11, 1, 0)]);
    let new = farm.epoch(11, key(1, 0));
    assert!(new > old);

    // Worker 10 wakes up and reports: refused, nothing changes.
    let before = farm.snapshot(&[1], &[10, 11]);
    let late = farm.at(1200).sched.complete(10, key(1, 0), old, 1200);
    let expected = Refused::StaleEpoch {
        task: key(1, 0),
        epoch: old,
        current: Some(new),
    };
    assert_eq!(late, Err(expected));
    assert_eq!(farm.snapshot(&[1], &[10, 11]), before);

    assert_eq!(
        farm.complete(11, key(1, 0)),
        Ok(Accepted::TaskDone { job_done: true })
    );
    let after_done = farm.sched.complete(10, key(1, 0), old, 1200);
    assert_eq!(after_done, Err(Refused::AlreadyDone { task: key(1, 0) }));
    assert_eq!(farm.progress(1), (1, 1, 0, 0));
}

/// A preempted worker's result, sent after its last heartbeat, is not a
/// sign of life: when its other lease runs out, the task goes to another
/// worker, not back to the dead one (seen with a killed spot worker).
#[test]
fn a_task_whose_lease_ran_out_does_not_go_back_to_its_silent_worker() {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 3));
    farm.worker((10, 2, &["builtin"]));
    assert_eq!(farm.assign(), [(10, 1, 0), (10, 1, 1)]);
    // A result at 400, then nothing more: killed without another heartbeat.
    farm.at(400).complete(10, key(1, 0)).unwrap();
    assert_eq!(farm.assign(), [(10, 1, 2)]);
    assert_eq!(farm.at(LEASE).sched.expire(LEASE).len(), 1);
    assert_eq!(farm.assign(), [], "nothing goes to the silent worker");
    farm.worker((11, 1, &["builtin"]));
    assert_eq!(farm.assign(), [(11, 1, 1)], "task 1 goes to a live worker");
    // Heard from again, the first worker takes work once more.
    farm.at(LEASE + 1).sched.heartbeat(10, LEASE + 1);
    farm.job((2, 0, "builtin", 1));
    assert_eq!(farm.assign(), [(10, 2, 0)]);
}

#[test]
fn expired_and_removed_tasks_go_back_to_the_front_in_order() {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 6));
    farm.worker((10, 2, &["builtin"]));
    farm.worker((11, 1, &["builtin"]));
    assert_eq!(farm.assign(), [(10, 1, 0), (11, 1, 1), (10, 1, 2)]);

    assert_eq!(farm.sched.remove_worker(10, 10), [key(1, 0), key(1, 2)]);
    assert_eq!(farm.sched.running_on(10), []);
    assert_eq!(
        farm.sched.remove_worker(10, 10),
        [],
        "removing twice is harmless"
    );
    assert_eq!(farm.progress(1), (6, 0, 1, 5));

    farm.at(20).worker((12, 3, &["builtin"]));
    assert_eq!(farm.assign(), [(12, 1, 0), (12, 1, 2), (12, 1, 3)]);
    let refused = farm.sched.complete(10, key(1, 0), Epoch(1), 20);
    assert!(matches!(
        refused,
        Err(Refused::StaleEpoch {
            current: Some(_),
            ..
        })
    ));

    // Worker 11's lease expires too: task 1 is next, ahead of task 4.
    farm.sched.heartbeat(12, 20);
    assert_eq!(farm.at(LEASE).sched.expire(LEASE).len(), 1);
    farm.sched.remove_worker(11, LEASE);
    farm.worker((13, 2, &["builtin"]));
    assert_eq!(farm.assign(), [(13, 1, 1), (13, 1, 4)]);
}

// ---- cancel ----

#[test]
fn cancel_returns_running_leases_and_stops_the_job() {
    let mut farm = Farm::new();
    farm.job((1, 5, "builtin", 4));
    farm.job((2, 0, "builtin", 1));
    farm.worker((10, 2, &["builtin"]));
    assert_eq!(farm.assign(), [(10, 1, 0), (10, 1, 1)]);
    let epoch0 = farm.epoch(10, key(1, 0));
    let epoch1 = farm.epoch(10, key(1, 1));

    let dropped = farm.sched.cancel_job(1);
    let expected = [
        Assignment {
            worker: 10,
            task: key(1, 0),
            epoch: epoch0,
        },
        Assignment {
            worker: 10,
            task: key(1, 1),
            epoch: epoch1,
        },
    ];
    assert_eq!(dropped, expected);
    assert_eq!(farm.sched.job_state(1), Some(JobState::Canceled));
    assert_eq!(farm.progress(1), (4, 0, 0, 0));
    assert_eq!(farm.assign(), [(10, 2, 0)], "only the other job runs");

    let late = farm.sched.complete(10, key(1, 0), epoch0, 0);
    let expected = Refused::JobNotRunning {
        job: 1,
        state: JobState::Canceled,
    };
    assert_eq!(late, Err(expected));
    assert_eq!(farm.sched.cancel_job(1), [], "canceling twice is harmless");
    assert_eq!(farm.sched.cancel_job(99), []);

    farm.complete(10, key(2, 0)).unwrap();
    assert_eq!(farm.sched.cancel_job(2), [], "a done job stays done");
    assert_eq!(farm.sched.job_state(2), Some(JobState::Done));
}

// ---- fail ----

/// A worker with two slots renders a two-task job under `max_attempts`; task 0
/// fails `failures` times (retried each time), then both tasks succeed if the
/// job is still live. The job must end as `expected`.
#[track_caller]
fn check_fail(max_attempts: u32, failures: u32, expected: JobState) {
    let mut farm = Farm::with(Config {
        max_attempts,
        ..config()
    });
    farm.job((1, 0, "builtin", 2));
    farm.worker((10, 2, &["builtin"]));
    assert_eq!(farm.assign(), [(10, 1, 0), (10, 1, 1)]);
    let other = farm.epoch(10, key(1, 1));
    for attempt in 1..=failures {
        let outcome = farm
            .fail(10, key(1, 0), &format!("error {attempt}"))
            .unwrap();
        assert_eq!(outcome.attempts, attempt);
        if outcome.job_failed {
            assert_eq!(
                outcome.cancel,
                [Assignment {
                    worker: 10,
                    task: key(1, 1),
                    epoch: other
                }]
            );
            break;
        }
        assert_eq!(outcome.cancel, []);
        assert_eq!(
            farm.assign(),
            [(10, 1, 0)],
            "retried at once on the free slot"
        );
    }
    if farm.sched.job_state(1).is_some_and(|s| s.is_live()) {
        farm.complete(10, key(1, 0)).unwrap();
        farm.complete(10, key(1, 1)).unwrap();
    }
    assert_eq!(farm.sched.job_state(1), Some(expected));
}

#[test]
fn failed_task_is_retried_until_max_attempts_then_the_job_fails() {
    check_fail(3, 0, JobState::Done);
    check_fail(3, 2, JobState::Done);
    // The job's error collects every distinct error once.
    let all = "worker 10: error 1; worker 10: error 2; worker 10: error 3";
    check_fail(3, 3, JobState::Failed(all.into()));
    assert_eq!(
        collect_errors(&[
            (10, "no OIDN".into()),
            (11, "no OIDN".into()),
            (10, "no OIDN".into()),
            (11, "crashed".into()),
        ]),
        "workers 10, 11 (3 attempts): no OIDN; worker 11: crashed"
    );
    check_fail(1, 1, JobState::Failed("worker 10: error 1".into()));
    check_fail(0, 1, JobState::Failed("worker 10: error 1".into()));
}

#[test]
fn failed_task_is_retried_after_the_rest_of_its_job() {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 3));
    farm.worker((10, 1, &["builtin"]));
    assert_eq!(farm.assign(), [(10, 1, 0)]);
    let outcome = farm.fail(10, key(1, 0), "out of GPU memory").unwrap();
    assert!(!outcome.job_failed);
    assert_eq!(farm.progress(1), (3, 0, 0, 3));
    assert_eq!(farm.assign(), [(10, 1, 1)]);
}

#[test]
fn failed_job_refuses_results_and_hands_out_nothing() {
    let mut farm = Farm::with(Config {
        max_attempts: 1,
        ..config()
    });
    farm.job((1, 0, "builtin", 4));
    farm.worker((10, 1, &["builtin"]));
    farm.worker((11, 1, &["builtin"]));
    farm.assign();
    let epoch = farm.epoch(11, key(1, 1));
    let outcome = farm
        .fail(10, key(1, 0), "missing texture wood.png")
        .unwrap();
    let cancel = [Assignment {
        worker: 11,
        task: key(1, 1),
        epoch,
    }];
    assert_eq!(
        outcome,
        FailOutcome {
            attempts: 1,
            job_failed: true,
            blocklisted: false,
            cancel: cancel.into()
        }
    );
    let failed = JobState::Failed("worker 10: missing texture wood.png".into());
    assert_eq!(farm.sched.job_state(1), Some(failed.clone()));
    assert_eq!(farm.progress(1), (4, 0, 0, 0));
    assert_eq!(farm.assign(), []);
    let late = farm.sched.complete(11, key(1, 1), epoch, 0);
    assert_eq!(
        late,
        Err(Refused::JobNotRunning {
            job: 1,
            state: failed
        })
    );
    assert_eq!(farm.sched.next_deadline(), None);
}

// ---- epochs ----

#[test]
fn epochs_increase_strictly_from_first_epoch() {
    let mut farm = Farm::with(Config {
        first_epoch: 7_000,
        ..config()
    });
    assert_eq!(farm.sched.next_epoch(), 7_000);
    farm.job((1, 0, "builtin", 3));
    farm.worker((10, 2, &["builtin"]));
    farm.worker((11, 1, &["builtin"]));
    let mut epochs: Vec<u64> = farm.sched.assign(0).iter().map(|a| a.epoch.0).collect();
    farm.at(LEASE).sched.expire(LEASE);
    // Heard from again after their leases expired: they take work again.
    farm.sched.heartbeat(10, LEASE);
    farm.sched.heartbeat(11, LEASE);
    epochs.extend(farm.sched.assign(LEASE).iter().map(|a| a.epoch.0));
    farm.sched.remove_worker(10, LEASE);
    farm.worker((12, 3, &["builtin"]));
    epochs.extend(farm.sched.assign(LEASE).iter().map(|a| a.epoch.0));
    assert_eq!(epochs, (7_000..7_008).collect::<Vec<_>>());
    assert_eq!(farm.sched.next_epoch(), 7_008);
}

// ---- randomized simulation ----

/// SplitMix64: a tiny deterministic PRNG, so a failing seed replays exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        (!items.is_empty()).then(|| items[self.below(items.len() as u64) as usize])
    }
}

/// How often the simulation hit each interesting event, so a test can show
/// that it did not pass vacuously.
#[derive(Debug, Default)]
struct Seen {
    joined: u32,
    died: u32,
    left: u32,
    expired: u32,
    late_accepted: u32,
    late_refused: u32,
    retried: u32,
    canceled: u32,
    /// Second attempts of stragglers handed out.
    speculated: u32,
    /// Attempts that lost to the other attempt of their task.
    superseded: u32,
}

/// What a fake worker believes it is rendering.
#[derive(Default)]
struct FakeWorker {
    tasks: Vec<(TaskKey, Epoch)>,
    last_heartbeat: Millis,
}

const SIM_JOBS: [JobSpec; 4] = [
    (1, 0, "builtin", 200),
    (2, 5, "builtin", 60),
    (3, 0, "blender", 100),
    (4, 1, "builtin", 120),
];

/// Workers join, render, fail, leave gracefully or die silently (their
/// leases expire and the server removes them later); stale results from dead
/// workers arrive late; job 4 may be canceled midway. Every accepted result
/// must be new, every live worker's view must match the scheduler's, and
/// every job must end done (or canceled, for job 4).
fn simulate(seed: u64, pipelining: bool) -> Seen {
    let lease = 300;
    let mut rng = Rng(seed);
    let mut sched = Scheduler::new(Config {
        lease_ms: lease,
        max_attempts: u32::MAX,
        first_epoch: seed * 1_000,
        retry_backoff_ms: 0,
        straggler_percent: 300,
    });
    sched.set_pipelining(pipelining);
    for (seq, &(id, priority, engine, total)) in SIM_JOBS.iter().enumerate() {
        let job = NewJob {
            id,
            priority,
            submit_seq: seq as u64,
            engine: engine.into(),
            pending: (0..total).collect(),
            total,
        };
        sched.add_job(job, 0);
    }
    let mut live: BTreeMap<WorkerId, FakeWorker> = BTreeMap::new();
    let mut dead: BTreeMap<WorkerId, Millis> = BTreeMap::new();
    let mut blender_workers: HashSet<WorkerId> = HashSet::new();
    let mut late: Vec<(WorkerId, TaskKey, Epoch)> = Vec::new();
    let mut accepted: HashSet<TaskKey> = HashSet::new();
    let mut canceled = false;
    let mut last_epoch = None;
    let mut next_worker: WorkerId = 1;
    let mut now: Millis = 0;
    let mut seen = Seen::default();

    for step in 0.. {
        assert!(step < 100_000, "seed {seed}: the farm never finished");
        let all_over = SIM_JOBS
            .iter()
            .all(|j| !sched.job_state(j.0).unwrap().is_live());
        if all_over {
            break;
        }
        now += rng.below(20);

        // Keep at least one live worker able to render every engine.
        let can_blender = live.keys().any(|w| blender_workers.contains(w));
        let roll = if can_blender { rng.below(100) } else { 0 };
        let ids: Vec<WorkerId> = live.keys().copied().collect();
        match roll {
            0..=2 if live.len() < 40 => {
                let id = next_worker;
                next_worker += 1;
                let mut engines = vec!["builtin".to_string()];
                if !can_blender || rng.below(2) == 0 {
                    engines.push("blender".to_string());
                    blender_workers.insert(id);
                }
                sched.add_worker(id, 1 + rng.below(4) as u32, engines, now);
                sched.set_worker_rtt(id, rng.below(200));
                seen.joined += 1;
                live.insert(
                    id,
                    FakeWorker {
                        last_heartbeat: now,
                        ..Default::default()
                    },
                );
            }
            3..=4 => {
                // Silent death: the server only notices much later.
                if let Some(id) = rng.pick(&ids) {
                    let gone = live.remove(&id).unwrap();
                    late.extend(gone.tasks.iter().map(|&(t, e)| (id, t, e)));
                    dead.insert(id, now);
                    seen.died += 1;
                }
            }
            5 => {
                // Graceful leave: leases handed back at once.
                if let Some(id) = rng.pick(&ids) {
                    let gone = live.remove(&id).unwrap();
                    let mut held: Vec<TaskKey> = gone.tasks.iter().map(|&(t, _)| t).collect();
                    held.sort();
                    assert_eq!(sched.remove_worker(id, now), held);
                    late.extend(gone.tasks.iter().map(|&(t, e)| (id, t, e)));
                    seen.left += 1;
                }
            }
            6..=8 => {
                if !late.is_empty() {
                    let (worker, task, epoch) =
                        late.swap_remove(rng.below(late.len() as u64) as usize);
                    if sched.complete(worker, task, epoch, now).is_ok() {
                        assert!(accepted.insert(task), "seed {seed}: {task} accepted twice");
                        assert!(!(canceled && task.job == 4), "result accepted after cancel");
                        seen.late_accepted += 1;
                    } else {
                        seen.late_refused += 1;
                    }
                }
            }
            9 if !canceled && rng.below(10) == 0 => {
                canceled = true;
                seen.canceled += 1;
                for lease in sched.cancel_job(4) {
                    if let Some(fake) = live.get_mut(&lease.worker) {
                        fake.tasks.retain(|&(t, _)| t != lease.task);
                        late.push((lease.worker, lease.task, lease.epoch));
                    }
                }
            }
            10..=14 => {
                if let Some(id) = rng.pick(&ids) {
                    let fake = live.get_mut(&id).unwrap();
                    if let Some((task, epoch)) = rng.pick(&fake.tasks) {
                        fake.tasks.retain(|&(t, _)| t != task);
                        let outcome = sched
                            .fail(id, task, epoch, "transient".into(), now)
                            .unwrap();
                        assert!(!outcome.job_failed);
                        seen.retried += 1;
                    }
                }
            }
            _ => {
                if let Some(id) = rng.pick(&ids) {
                    let fake = live.get_mut(&id).unwrap();
                    if let Some((task, epoch)) = rng.pick(&fake.tasks) {
                        fake.tasks.retain(|&(t, _)| t != task);
                        let result = sched.complete(id, task, epoch, now);
                        assert!(
                            result.is_ok(),
                            "seed {seed}: live worker refused: {result:?}"
                        );
                        assert!(accepted.insert(task), "seed {seed}: {task} accepted twice");
                    }
                }
            }
        }
        // The losers of straggler races stop; a late result of theirs is refused.
        for lost in sched.take_superseded() {
            seen.superseded += 1;
            if let Some(fake) = live.get_mut(&lost.worker) {
                fake.tasks.retain(|&(t, _)| t != lost.task);
            }
            late.push((lost.worker, lost.task, lost.epoch));
        }

        for (&id, fake) in live.iter_mut() {
            if now - fake.last_heartbeat >= lease / 3 {
                sched.heartbeat(id, now);
                fake.last_heartbeat = now;
            }
        }
        if sched
            .next_deadline()
            .is_some_and(|deadline| deadline <= now)
        {
            for lease in sched.expire(now) {
                seen.expired += 1;
                assert!(
                    !live.contains_key(&lease.worker),
                    "a heartbeating worker's lease expired"
                );
            }
        }
        let noticed: Vec<WorkerId> = dead
            .iter()
            .filter(|&(_, &t)| now >= t + 2 * lease)
            .map(|(&id, _)| id)
            .collect();
        for id in noticed {
            dead.remove(&id);
            sched.remove_worker(id, now);
        }
        for given in sched.assign(now) {
            assert!(Some(given.epoch) > last_epoch, "epochs strictly increase");
            last_epoch = Some(given.epoch);
            assert!(
                !(canceled && given.task.job == 4),
                "canceled job handed out"
            );
            if sched.task_view(given.task).unwrap().lease.unwrap().0 != given.worker {
                seen.speculated += 1;
            }
            if let Some(fake) = live.get_mut(&given.worker) {
                fake.tasks.push((given.task, given.epoch));
            }
        }
        // Queued tasks stolen by idle workers: their first holders drop them.
        for lost in sched.take_superseded() {
            seen.superseded += 1;
            if let Some(fake) = live.get_mut(&lost.worker) {
                fake.tasks
                    .retain(|&(t, e)| (t, e) != (lost.task, lost.epoch));
            }
            late.push((lost.worker, lost.task, lost.epoch));
        }

        for (&id, fake) in &live {
            let mut believed = fake.tasks.clone();
            believed.sort();
            assert_eq!(
                sched.running_on(id),
                believed,
                "seed {seed}: worker {id} disagrees"
            );
        }
        for &(id, .., total) in &SIM_JOBS {
            let p = sched.job_progress(id).unwrap();
            let done = accepted.iter().filter(|t| t.job == id).count() as u32;
            assert_eq!(p.done, done);
            if sched.job_state(id).unwrap().is_live() {
                assert_eq!(
                    p.done + p.running + p.queued,
                    total,
                    "seed {seed}: job {id} lost a task"
                );
            }
        }
    }

    for &(id, .., total) in &SIM_JOBS {
        let state = sched.job_state(id).unwrap();
        if id == 4 && state == JobState::Canceled {
            continue;
        }
        assert_eq!(state, JobState::Done, "seed {seed}: job {id}");
        let done = accepted.iter().filter(|t| t.job == id).count() as u32;
        assert_eq!(
            done, total,
            "seed {seed}: job {id} done exactly once per task"
        );
    }
    for (worker, task, epoch) in late {
        assert!(
            sched.complete(worker, task, epoch, now).is_err(),
            "late result after the end"
        );
    }
    seen
}

#[test]
fn random_farm_renders_every_task_exactly_once() {
    let mut total = Seen::default();
    for seed in 1..=40 {
        let seen = simulate(seed, seed % 2 == 0);
        total.joined += seen.joined;
        total.died += seen.died;
        total.left += seen.left;
        total.expired += seen.expired;
        total.late_accepted += seen.late_accepted;
        total.late_refused += seen.late_refused;
        total.retried += seen.retried;
        total.canceled += seen.canceled;
        total.speculated += seen.speculated;
        total.superseded += seen.superseded;
    }
    eprintln!("{total:?}");
    let Seen {
        joined,
        died,
        left,
        expired,
        late_accepted,
        late_refused,
        retried,
        canceled,
        speculated,
        superseded,
    } = total;
    for (event, count) in [
        ("joined", joined),
        ("died", died),
        ("left", left),
        ("expired", expired),
        ("late_accepted", late_accepted),
        ("late_refused", late_refused),
        ("retried", retried),
        ("canceled", canceled),
        ("speculated", speculated),
        ("superseded", superseded),
    ] {
        assert!(count > 0, "the simulation never saw {event}");
    }
}

/// 100k tasks on 32 workers, one completion and one `assign` at a time: runs
/// in well under a second unless something in the hot path is quadratic.
#[test]
fn large_job_completes_with_one_assign_per_completion() {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 100_000));
    for worker in 0..32 {
        farm.worker((worker, 4, &["builtin"]));
    }
    let mut running: VecDeque<Assignment> = farm.sched.assign(0).into();
    assert_eq!(running.len(), 128);
    let mut done = 0;
    while let Some(lease) = running.pop_front() {
        let now = farm.now + 1;
        farm.at(now);
        if done % 256 == 0 {
            (0..32).for_each(|worker| {
                farm.sched.heartbeat(worker, now);
            });
        }
        farm.sched
            .complete(lease.worker, lease.task, lease.epoch, now)
            .unwrap();
        done += 1;
        running.extend(farm.sched.assign(now));
    }
    assert_eq!(done, 100_000);
    assert_eq!(farm.sched.job_state(1), Some(JobState::Done));
}

#[test]
fn a_silent_worker_gets_no_new_work_until_it_is_heard_from() {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 4));
    farm.worker((1, 1, &["builtin"]));
    farm.worker((2, 1, &["builtin"]));
    assert_eq!(farm.assign(), vec![(1, 1, 0), (2, 1, 1)]);
    // Worker 1 keeps heartbeating; worker 2 goes silent (killed, partitioned).
    farm.at(600).sched.heartbeat(1, 600);
    farm.at(1_000);
    let expired: Vec<_> = farm
        .sched
        .expire(1_000)
        .iter()
        .map(|a| (a.worker, a.task.index))
        .collect();
    assert_eq!(expired, vec![(2, 1)]);
    // The expired task must not go straight back to the silent worker.
    assert_eq!(farm.assign(), vec![]);
    let epoch = farm.sched.running_on(1)[0].1;
    farm.sched.complete(1, key(1, 0), epoch, 1_000).unwrap();
    assert_eq!(
        farm.assign(),
        vec![(1, 1, 1)],
        "the requeued task goes to the live worker"
    );
    // Worker 2 wakes up: heartbeat says it was silent, and it takes work again.
    assert!(farm.at(1_100).sched.heartbeat(2, 1_100));
    assert!(!farm.sched.heartbeat(2, 1_200));
    farm.at(1_200);
    assert_eq!(farm.assign(), vec![(2, 1, 2)]);
}

#[test]
fn a_paused_job_hands_out_nothing_until_resumed() {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 3));
    farm.job((2, 0, "builtin", 1));
    farm.worker((1, 1, &["builtin"]));
    assert!(farm.sched.pause_job(1, true));
    // Job 2 goes first although job 1 was submitted earlier.
    assert_eq!(farm.assign(), vec![(1, 2, 0)]);
    let epoch = farm.sched.running_on(1)[0].1;
    farm.sched.complete(1, key(2, 0), epoch, 0).unwrap();
    assert_eq!(farm.assign(), vec![], "paused: nothing to hand out");
    assert!(farm.sched.pause_job(1, false));
    assert_eq!(farm.assign(), vec![(1, 1, 0)]);
    assert!(
        !farm.sched.pause_job(2, true),
        "a done job cannot be paused"
    );
    assert!(
        !farm.sched.pause_job(9, true),
        "an unknown job cannot be paused"
    );
}

#[test]
fn a_draining_worker_keeps_its_leases_but_takes_no_new_work() {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 4));
    farm.worker((1, 2, &["builtin"]));
    assert_eq!(farm.assign(), vec![(1, 1, 0), (1, 1, 1)]);
    assert!(farm.sched.drain_worker(1));
    let leases = farm.sched.running_on(1);
    farm.sched
        .complete(1, leases[0].0, leases[0].1, 10)
        .unwrap();
    assert_eq!(farm.assign(), vec![], "no new work for a draining worker");
    // Its other lease is still valid.
    farm.sched
        .complete(1, leases[1].0, leases[1].1, 20)
        .unwrap();
    let view = farm.sched.task_view(key(1, 1)).unwrap();
    assert!(view.done && view.lease.is_none());
    farm.worker((2, 1, &["builtin"]));
    assert_eq!(farm.assign(), vec![(2, 1, 2)]);
}

#[test]
fn a_worker_that_keeps_failing_a_job_is_blocklisted_and_others_finish_it() {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 4));
    farm.worker((10, 1, &["builtin"]));
    // The broken worker fails three different tasks once each.
    for index in 0..3 {
        assert_eq!(farm.assign(), [(10, 1, index)]);
        let outcome = farm.fail(10, key(1, index), "engine crashed").unwrap();
        assert!(!outcome.job_failed);
        assert_eq!(
            outcome.blocklisted,
            index == 2,
            "blocklisted on its third failure"
        );
    }
    assert!(farm.sched.is_blocklisted(1, 10));
    assert_eq!(
        farm.assign(),
        [],
        "the blocklisted worker gets none of the job"
    );
    // A second job still goes to it.
    farm.job((2, 0, "builtin", 1));
    assert_eq!(farm.assign(), [(10, 2, 0)]);
    // A healthy worker renders every task of the first job.
    farm.worker((11, 1, &["builtin"]));
    for _ in 0..4 {
        let given = farm.assign();
        assert_eq!(given.len(), 1);
        assert_eq!(given[0].0, 11);
        farm.complete(11, key(1, given[0].2)).unwrap();
    }
    assert_eq!(farm.sched.job_state(1), Some(JobState::Done));
}

/// A task failing on worker 10 at t=0 waits out `backoff` before anyone
/// gets it again; the expected waits double with each failure.
#[track_caller]
fn check_retry_backoff(base: Millis, expected_waits: &[Millis]) {
    let mut farm = Farm::with(Config {
        lease_ms: 100_000,
        max_attempts: 10,
        retry_backoff_ms: base,
        ..config()
    });
    farm.job((1, 0, "builtin", 1));
    farm.worker((10, 1, &["builtin"]));
    farm.worker((11, 1, &["builtin"]));
    let mut now = 0;
    for &wait in expected_waits {
        let given = farm.at(now).assign();
        assert_eq!(given.len(), 1, "the task is handed out at {now}");
        let worker = given[0].0;
        farm.fail(worker, key(1, 0), "driver crashed").unwrap();
        assert_eq!(farm.progress(1), (1, 0, 0, 1), "waiting counts as queued");
        assert_eq!(farm.sched.next_deadline(), Some(now + wait));
        if wait > 0 {
            assert_eq!(farm.at(now + wait - 1).assign(), [], "still backing off");
        }
        now += wait;
    }
}

#[test]
fn failed_tasks_are_retried_with_doubling_backoff() {
    check_retry_backoff(500, &[500, 1_000, 2_000, 4_000]);
    check_retry_backoff(40_000, &[40_000, MAX_RETRY_BACKOFF_MS]);
}

#[test]
fn a_task_in_backoff_is_dropped_when_its_job_is_canceled() {
    let mut farm = Farm::with(Config {
        retry_backoff_ms: 1_000,
        ..config()
    });
    farm.job((1, 0, "builtin", 1));
    farm.worker((10, 1, &["builtin"]));
    farm.assign();
    farm.fail(10, key(1, 0), "crash").unwrap();
    assert_eq!(farm.sched.cancel_job(1), []);
    assert_eq!(farm.progress(1), (1, 0, 0, 0));
    assert_eq!(farm.at(5_000).assign(), []);
}

/// Worker 10 rendered task (1, 0) under `epoch` (1 is what this farm
/// handed out); then `situation` happened, and worker 20 joins saying it
/// holds task (1, 0) under `claimed`. Adoption must give `expected`.
#[track_caller]
fn check_adopt(situation: &str, claimed: u64, expected: Result<(), &str>) {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 2));
    farm.worker((10, 1, &["builtin"]));
    assert_eq!(farm.assign(), [(10, 1, 0)]);
    match situation {
        // The coordinator lost the worker's connection: its task was requeued.
        "worker lost" => {
            farm.sched.remove_worker(10, 0);
        }
        // The old connection is not noticed gone yet: the lease is still there.
        "old connection open" => {}
        "done elsewhere" => {
            farm.sched.remove_worker(10, 0);
            farm.worker((11, 1, &["builtin"]));
            assert_eq!(farm.assign(), [(11, 1, 0)]);
            farm.complete(11, key(1, 0)).unwrap();
        }
        "reassigned" => {
            farm.sched.remove_worker(10, 0);
            farm.worker((11, 1, &["builtin"]));
            assert_eq!(farm.assign(), [(11, 1, 0)]);
        }
        "canceled" => {
            farm.sched.cancel_job(1);
        }
        "in backoff" => {
            let mut f = Farm::with(Config {
                retry_backoff_ms: 10_000,
                ..config()
            });
            f.job((1, 0, "builtin", 2));
            f.worker((10, 1, &["builtin"]));
            f.assign();
            f.fail(10, key(1, 0), "crash").unwrap();
            farm = f;
        }
        other => panic!("unknown situation {other}"),
    }
    farm.at(500).worker((20, 1, &["builtin"]));
    let before = farm.snapshot(&[1], &[10, 11, 20]);
    let got = farm.sched.adopt(20, key(1, 0), Epoch(claimed), 500);
    match expected {
        Ok(()) => {
            assert_eq!(got, Ok(()), "{situation}");
            assert_eq!(farm.sched.running_on(20), [(key(1, 0), Epoch(claimed))]);
            assert_eq!(farm.sched.running_on(10), [], "{situation}");
            assert_eq!(farm.progress(1), (2, 0, 1, 1), "{situation}");
            // The adopted lease lives on from now, and its result counts.
            assert_eq!(farm.sched.next_deadline(), Some(500 + LEASE));
            farm.sched
                .complete(20, key(1, 0), Epoch(claimed), 600)
                .unwrap();
            assert_eq!(farm.at(600).assign(), [(20, 1, 1)], "{situation}");
        }
        Err(text) => {
            let refused = got.expect_err(situation).to_string();
            assert!(refused.contains(text), "{situation}: {refused}");
            assert_eq!(farm.snapshot(&[1], &[10, 11, 20]), before, "{situation}");
        }
    }
}

#[test]
fn a_rejoining_worker_keeps_the_tasks_it_still_renders() {
    check_adopt("worker lost", 1, Ok(()));
    check_adopt("old connection open", 1, Ok(()));
    check_adopt("in backoff", 1, Ok(()));
    check_adopt("done elsewhere", 1, Err("already done"));
    check_adopt("reassigned", 1, Err("handed out again under epoch 2"));
    check_adopt("canceled", 1, Err("canceled"));
    // An epoch this farm never handed out is not taken on trust.
    check_adopt("worker lost", 99, Err("epoch 99"));
}

#[test]
fn epochs_of_an_earlier_coordinator_run_are_adopted_after_a_restart() {
    // The new run starts its epochs above every earlier one.
    let mut farm = Farm::with(Config {
        first_epoch: 2 << 32,
        ..config()
    });
    farm.job((1, 0, "builtin", 1));
    farm.worker((1, 1, &["builtin"]));
    let old = Epoch((1 << 32) + 5);
    farm.sched.adopt(1, key(1, 0), old, 0).unwrap();
    assert_eq!(farm.assign(), [], "its slot is taken by the adopted task");
    assert_eq!(
        farm.sched.complete(1, key(1, 0), old, 10),
        Ok(Accepted::TaskDone { job_done: true })
    );
}

/// Job 1 has 5 tasks; worker 10 is fast (100 ms a task), worker 11 took
/// task 1 at t=0 and is still on it at `now`. Returns the farm after the
/// fast worker finished tasks 0, 2, 3 and 4 by t=400 and `assign` ran at
/// `now`, with what that assign handed out.
fn straggler_farm(straggler_percent: u32, now: Millis) -> (Farm, Vec<Given>) {
    let mut farm = Farm::with(Config {
        lease_ms: 100_000,
        straggler_percent,
        ..config()
    });
    farm.job((1, 0, "builtin", 5));
    farm.worker((10, 1, &["builtin"]));
    farm.worker((11, 1, &["builtin"]));
    assert_eq!(farm.assign(), [(10, 1, 0), (11, 1, 1)]);
    for (t, next) in [(100, Some(2)), (200, Some(3)), (300, Some(4)), (400, None)] {
        let done = [0, 2, 3, 4][t as usize / 100 - 1];
        farm.at(t).complete(10, key(1, done)).unwrap();
        let given = farm.assign();
        match next {
            Some(index) => assert_eq!(given, [(10, 1, index)]),
            None => assert_eq!(given, [], "at 400 nothing is a straggler yet"),
        }
    }
    let given = farm.at(now).assign();
    (farm, given)
}

#[test]
fn a_straggler_is_started_again_on_an_idle_worker_and_the_first_result_wins() {
    // Under the minimum running time, or under 3x the mean of 100 ms: no.
    assert_eq!(straggler_farm(300, 999).1, []);
    assert_eq!(straggler_farm(0, 50_000).1, [], "turned off");
    assert_eq!(
        straggler_farm(100_000, 50_000).1,
        [],
        "under 1000x the mean"
    );
    let (mut farm, given) = straggler_farm(300, 1_000);
    assert_eq!(given, [(10, 1, 1)], "a second attempt on the idle worker");
    assert_eq!(farm.progress(1), (5, 4, 1, 0), "still one task running");
    let first = farm.epoch(11, key(1, 1));
    let second = farm.epoch(10, key(1, 1));
    assert_ne!(first, second);
    // Never a third attempt.
    farm.worker((12, 1, &["builtin"]));
    assert_eq!(farm.at(5_000).assign(), []);
    // The second attempt finishes first: it wins, the first is superseded.
    assert_eq!(
        farm.complete(10, key(1, 1)),
        Ok(Accepted::TaskDone { job_done: true })
    );
    assert_eq!(
        farm.sched.take_superseded(),
        [Assignment {
            worker: 11,
            task: key(1, 1),
            epoch: first
        }]
    );
    assert_eq!(farm.sched.take_superseded(), []);
    assert_eq!(farm.sched.running_on(11), []);
    assert_eq!(
        farm.sched.complete(11, key(1, 1), first, 5_100),
        Err(Refused::AlreadyDone { task: key(1, 1) }),
        "the loser's late result is refused"
    );
}

#[test]
fn the_first_attempt_of_a_straggler_can_still_win() {
    let (mut farm, _) = straggler_farm(300, 1_000);
    let second = farm.epoch(10, key(1, 1));
    farm.at(1_050).complete(11, key(1, 1)).unwrap();
    assert_eq!(
        farm.sched.take_superseded(),
        [Assignment {
            worker: 10,
            task: key(1, 1),
            epoch: second
        }]
    );
    assert_eq!(farm.progress(1), (5, 5, 0, 0));
}

#[test]
fn when_one_attempt_of_a_straggler_is_lost_the_other_carries_on() {
    // The slow worker vanishes: the second attempt becomes the task's lease.
    let (mut farm, _) = straggler_farm(300, 1_000);
    assert_eq!(farm.sched.remove_worker(11, 1_100), [key(1, 1)]);
    assert_eq!(farm.progress(1), (5, 4, 1, 0), "not requeued");
    farm.worker((11, 1, &["builtin"]));
    assert_eq!(farm.at(1_200).assign(), [], "nothing to hand out");
    farm.complete(10, key(1, 1)).unwrap();
    assert_eq!(farm.sched.take_superseded(), []);
    assert_eq!(farm.sched.job_state(1), Some(JobState::Done));

    // The second attempt fails: the first runs on, nothing is requeued and
    // the failure does not count against the task.
    let (mut farm, _) = straggler_farm(300, 1_000);
    let outcome = farm.fail(10, key(1, 1), "out of memory").unwrap();
    assert!(!outcome.job_failed);
    assert_eq!(outcome.attempts, 0);
    assert_eq!(farm.progress(1), (5, 4, 1, 0));
    assert_eq!(farm.sched.running_on(11).len(), 1);

    // The first attempt's lease expires: the second carries the task.
    let (mut farm, _) = straggler_farm(300, 1_000);
    farm.sched.heartbeat(10, 1_000);
    let expired = farm.sched.expire(100_000);
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].worker, 11);
    assert_eq!(farm.progress(1), (5, 4, 1, 0));
    assert_eq!(farm.sched.running_on(10).len(), 1);
}

// ---- pipelined leases ----

/// A farm with pipelined leases on.
fn pipelined() -> Farm {
    let mut farm = Farm::new();
    farm.sched.set_pipelining(true);
    farm
}

/// How many leases a one-slot worker holds, given its round trip and the
/// time its tasks take: one rendering plus `ceil(rtt / task)` queued, at
/// least one and at most `MAX_AHEAD_PER_SLOT` (and no more than it has
/// proven, see the huge-claim test below).
#[track_caller]
fn check_lease_depth(rtt_ms: Millis, task_ms: Option<Millis>, expected: usize) {
    let mut farm = pipelined();
    farm.job((1, 0, "builtin", 100));
    farm.worker((10, 1, &["builtin"]));
    farm.assign();
    // Eight results, each `task_ms` after the one before: the worker has
    // proven enough for any depth, and its task time is `task_ms`.
    if let Some(task_ms) = task_ms {
        for i in 0..8 {
            farm.at((u64::from(i) + 1) * task_ms)
                .complete(10, key(1, i))
                .unwrap();
            farm.assign();
        }
    }
    farm.sched.set_worker_rtt(10, rtt_ms);
    farm.assign();
    let held = farm.sched.running_on(10).len();
    assert_eq!(held, expected, "rtt {rtt_ms} ms, tasks of {task_ms:?} ms");
    let queued = (farm.sched.running_on(10).iter())
        .filter(|(t, _)| farm.sched.is_queued(10, *t))
        .count();
    assert_eq!(queued, expected - 1, "one renders, the others wait");
}

#[test]
fn the_lease_depth_follows_the_round_trip_over_the_task_time() {
    check_lease_depth(0, None, 2);
    check_lease_depth(80, None, 2);
    check_lease_depth(0, Some(1_000), 2);
    check_lease_depth(80, Some(1_000), 2);
    check_lease_depth(80, Some(40), 3);
    check_lease_depth(80, Some(30), 4);
    check_lease_depth(200, Some(30), 8);
    check_lease_depth(80, Some(1), 1 + MAX_AHEAD_PER_SLOT as usize);
    check_lease_depth(80, Some(0), 1 + MAX_AHEAD_PER_SLOT as usize);
}

/// A paused job stops once its running tasks end: the task queued behind
/// a render slot (not started) is handed back, and its holder is told to
/// drop it; resumed, the job hands it out again.
#[test]
fn pausing_a_job_hands_back_its_queued_tasks() {
    let mut farm = pipelined();
    farm.job((1, 0, "builtin", 4));
    farm.worker((10, 1, &["builtin"]));
    assert_eq!(farm.assign(), [(10, 1, 0), (10, 1, 1)]);
    assert!(farm.sched.is_queued(10, key(1, 1)));
    assert!(farm.sched.pause_job(1, true));
    let handed: Vec<(WorkerId, TaskKey)> = (farm.sched.take_superseded().iter())
        .map(|a| (a.worker, a.task))
        .collect();
    assert_eq!(handed, [(10, key(1, 1))]);
    let running: Vec<TaskKey> = (farm.sched.running_on(10).iter())
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(running, [key(1, 0)], "the rendering task goes on");
    farm.at(500).complete(10, key(1, 0)).unwrap();
    assert_eq!(farm.assign(), [], "paused: nothing more");
    assert!(farm.sched.pause_job(1, false));
    assert_eq!(farm.assign(), [(10, 1, 1), (10, 1, 2)]);
}

/// Without pipelining a worker holds one task per slot, as before.
#[test]
fn without_pipelining_a_slot_holds_only_the_task_it_renders() {
    let mut farm = Farm::new();
    farm.job((1, 0, "builtin", 10));
    farm.worker((10, 2, &["builtin"]));
    farm.sched.set_worker_rtt(10, 80);
    assert_eq!(farm.assign(), [(10, 1, 0), (10, 1, 1)]);
    assert!(!farm.sched.is_queued(10, key(1, 1)));
}

/// The worker renders in the order it was given its tasks: when one ends,
/// the oldest queued one moves up to the free slot, and billing (promoted)
/// starts there, at that time.
#[test]
fn a_queued_task_moves_up_when_its_slot_frees() {
    let mut farm = pipelined();
    farm.job((1, 0, "builtin", 4));
    farm.worker((10, 1, &["builtin"]));
    assert_eq!(farm.assign(), [(10, 1, 0), (10, 1, 1)]);
    assert!(!farm.sched.is_queued(10, key(1, 0)));
    assert!(farm.sched.is_queued(10, key(1, 1)));
    assert!(farm.sched.take_promoted().is_empty());
    farm.at(500).complete(10, key(1, 0)).unwrap();
    assert!(!farm.sched.is_queued(10, key(1, 1)));
    let promoted: Vec<(TaskKey, Millis)> = (farm.sched.take_promoted().iter())
        .map(|(a, at)| (a.task, *at))
        .collect();
    assert_eq!(promoted, [(key(1, 1), 500)]);
    assert_eq!(farm.assign(), [(10, 1, 2)]);
    // A failed task frees its slot the same way.
    farm.at(600).fail(10, key(1, 1), "boom").unwrap();
    assert!(!farm.sched.is_queued(10, key(1, 2)));
}

/// The case: a task queued behind a busy slot is not stuck there
/// while another worker idles. The idle worker steals the task queued
/// last; the busy worker's lease on it ends (it is told to drop it), and
/// a late result under that lease is refused.
#[test]
fn a_task_queued_behind_a_busy_slot_is_stolen_by_an_idle_worker() {
    let mut farm = pipelined();
    farm.job((1, 0, "builtin", 3));
    farm.worker((10, 1, &["builtin"]));
    assert_eq!(farm.assign(), [(10, 1, 0), (10, 1, 1)]);
    farm.at(100).complete(10, key(1, 0)).unwrap();
    assert_eq!(farm.assign(), [(10, 1, 2)]);
    let old = farm.epoch(10, key(1, 2));
    // Task 1 renders, task 2 waits behind it; worker 11 arrives idle.
    farm.worker((11, 1, &["builtin"]));
    assert_eq!(farm.assign(), [(11, 1, 2)]);
    let stolen: Vec<(WorkerId, TaskKey, Epoch)> = (farm.sched.take_superseded().iter())
        .map(|a| (a.worker, a.task, a.epoch))
        .collect();
    assert_eq!(stolen, [(10, key(1, 2), old)]);
    assert!(!farm.sched.is_queued(11, key(1, 2)), "it renders at once");
    let late = farm.sched.complete(10, key(1, 2), old, farm.now);
    assert!(matches!(late, Err(Refused::StaleEpoch { .. })), "{late:?}");
    // The rendering task is never taken from its worker.
    assert_eq!(farm.assign(), []);
    farm.complete(11, key(1, 2)).unwrap();
    assert_eq!(
        farm.complete(10, key(1, 1)),
        Ok(Accepted::TaskDone { job_done: true })
    );
}

/// Stealing respects what a worker may render: its engines, the job's
/// blocklist, a paused job.
#[test]
fn a_queued_task_is_stolen_only_by_a_worker_that_may_render_it() {
    let mut farm = pipelined();
    farm.job((1, 0, "blender", 2));
    farm.worker((10, 1, &["blender"]));
    assert_eq!(farm.assign(), [(10, 1, 0), (10, 1, 1)]);
    farm.worker((11, 1, &["builtin"]));
    assert_eq!(farm.assign(), [], "another engine");
    farm.sched.blocklist(1, 12);
    farm.worker((12, 1, &["blender"]));
    assert_eq!(farm.assign(), [], "blocklisted");
    farm.sched.pause_job(1, true);
    farm.worker((13, 1, &["blender"]));
    assert_eq!(farm.assign(), [], "paused");
    farm.sched.pause_job(1, false);
    assert_eq!(farm.assign(), [(13, 1, 1)]);
}

/// An idle worker steals a queued task before it doubles a straggler: a
/// queued lease has not started, so it is never a straggler itself.
#[test]
fn an_idle_worker_steals_a_queued_task_before_doubling_a_straggler() {
    let mut farm = Farm::with(Config {
        straggler_percent: 300,
        ..config()
    });
    farm.sched.set_pipelining(true);
    farm.job((1, 0, "builtin", 5));
    farm.worker((10, 1, &["builtin"]));
    assert_eq!(farm.assign(), [(10, 1, 0), (10, 1, 1)]);
    for (at, index) in [(10, 0), (20, 1), (30, 2)] {
        farm.at(at).complete(10, key(1, index)).unwrap();
        farm.assign();
        farm.sched.heartbeat(10, at);
    }
    // Task 3 renders since 30 ms (mean task 10 ms), task 4 waits.
    farm.at(800).sched.heartbeat(10, 800);
    farm.worker((11, 1, &["builtin"]));
    farm.at(1_500).sched.heartbeat(10, 1_500);
    assert_eq!(farm.assign(), [(11, 1, 4)], "stolen, not doubled");
    farm.sched.take_superseded();
    farm.worker((12, 1, &["builtin"]));
    assert_eq!(
        farm.assign(),
        [(12, 1, 3)],
        "the rendering one is a straggler"
    );
}

/// Drain: the worker finishes what it renders, and hands its queued tasks
/// back at once for the others to take.
#[test]
fn a_draining_worker_hands_its_queued_tasks_back() {
    let mut farm = pipelined();
    farm.job((1, 0, "builtin", 2));
    farm.worker((10, 1, &["builtin"]));
    assert_eq!(farm.assign(), [(10, 1, 0), (10, 1, 1)]);
    let queued = farm.epoch(10, key(1, 1));
    assert!(farm.sched.drain_worker(10));
    let handed: Vec<(WorkerId, TaskKey, Epoch)> = (farm.sched.take_superseded().iter())
        .map(|a| (a.worker, a.task, a.epoch))
        .collect();
    assert_eq!(handed, [(10, key(1, 1), queued)]);
    assert_eq!(farm.progress(1), (2, 0, 1, 1));
    farm.worker((11, 1, &["builtin"]));
    assert_eq!(farm.assign(), [(11, 1, 1)]);
    farm.complete(10, key(1, 0)).unwrap();
    assert_eq!(farm.sched.running_on(10), []);
}

/// Cancel and expiry end queued leases like rendering ones.
#[test]
fn cancel_and_expiry_end_queued_leases_too() {
    let mut farm = pipelined();
    farm.job((1, 0, "builtin", 4));
    farm.worker((10, 1, &["builtin"]));
    farm.assign();
    let ended: Vec<TaskKey> = farm.sched.cancel_job(1).iter().map(|a| a.task).collect();
    assert_eq!(ended, [key(1, 0), key(1, 1)]);
    let mut farm = pipelined();
    farm.job((1, 0, "builtin", 4));
    farm.worker((10, 1, &["builtin"]));
    farm.assign();
    let expired: Vec<TaskKey> = farm.sched.expire(LEASE).iter().map(|a| a.task).collect();
    assert_eq!(expired, [key(1, 0), key(1, 1)]);
    assert_eq!(farm.progress(1), (4, 0, 0, 4));
}

/// The randomized farm with pipelined leases: steals, hand-backs and
/// stale results, every task done exactly once.
#[test]
fn random_pipelined_farm_renders_every_task_exactly_once() {
    let superseded: u32 = (100..120).map(|seed| simulate(seed, true).superseded).sum();
    assert!(superseded > 0, "the simulation never stole a task");
}

/// Queued leases are earned like slots: a worker claiming a huge number
/// of slots holds no more leases, queued ones included, than it has
/// proven (`TRUSTED_SLOTS` plus one per result).
#[test]
fn pipelined_leases_never_exceed_what_a_worker_has_proven() {
    let mut farm = pipelined();
    farm.job((1, 0, "builtin", 64));
    farm.worker((10, 256, &["builtin"]));
    farm.sched.set_worker_rtt(10, 200);
    assert_eq!(farm.assign().len() as u32, TRUSTED_SLOTS);
    farm.at(5).complete(10, key(1, 0)).unwrap();
    assert_eq!(farm.assign().len(), 2, "one result earns one more lease");
    assert_eq!(farm.sched.running_on(10).len() as u32, TRUSTED_SLOTS + 1);
}
