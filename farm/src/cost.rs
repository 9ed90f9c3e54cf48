//! Cost accounting: every lease is billed at its worker's price per hour for
//! the time it was held, finished or not. A job's cost so far is the sum over
//! its leases; its cost to finish extrapolates the observed cost per finished
//! task over the tasks left. Pure bookkeeping with time passed in.

use std::collections::HashMap;

use crate::scheduler::{JobId, Millis, TaskKey, WorkerId};

struct OpenLease {
    worker: WorkerId,
    usd_per_hour: f64,
    /// When billing started; `None` while the lease waits queued behind
    /// its worker's render slots (pipelining), which costs nothing.
    started: Option<Millis>,
}

#[derive(Default, Clone, Copy)]
struct JobCost {
    /// Σ cost of ended leases.
    closed_usd: f64,
    finished_tasks: u32,
}

#[derive(Default)]
pub struct Ledger {
    /// Running leases by task and worker: a straggler's task has two.
    open: HashMap<(TaskKey, WorkerId), OpenLease>,
    jobs: HashMap<JobId, JobCost>,
}

fn cost(usd_per_hour: f64, from: Option<Millis>, to: Millis) -> f64 {
    from.map_or(0.0, |from| {
        usd_per_hour * to.saturating_sub(from) as f64 / 3_600_000.0
    })
}

impl Ledger {
    /// Starts billing a lease. A job restored from disk starts from the cost
    /// it had stored.
    pub fn restore_job(&mut self, job: JobId, closed_usd: f64, finished_tasks: u32) {
        self.jobs.insert(
            job,
            JobCost {
                closed_usd,
                finished_tasks,
            },
        );
    }

    /// Forgets a finished job (its cost is recorded with it) and any lease
    /// of it still open.
    pub fn forget_job(&mut self, job: JobId) {
        self.jobs.remove(&job);
        self.open.retain(|(task, _), _| task.job != job);
        crate::scheduler::shrink_when_sparse(&mut self.jobs);
    }

    pub fn lease_started(
        &mut self,
        task: TaskKey,
        worker: WorkerId,
        usd_per_hour: f64,
        now: Millis,
    ) {
        self.open.insert(
            (task, worker),
            OpenLease {
                worker,
                usd_per_hour,
                started: Some(now),
            },
        );
    }

    /// Opens a lease queued behind its worker's render slots: billed only
    /// from [`Ledger::lease_rendering`] on, so a worker holding its next
    /// tasks is not billed twice for one slot's time.
    pub fn lease_queued(&mut self, task: TaskKey, worker: WorkerId, usd_per_hour: f64) {
        self.open.insert(
            (task, worker),
            OpenLease {
                worker,
                usd_per_hour,
                started: None,
            },
        );
    }

    /// A queued lease moved up to a render slot at `at`: billing starts.
    pub fn lease_rendering(&mut self, task: TaskKey, worker: WorkerId, at: Millis) {
        if let Some(lease) = self.open.get_mut(&(task, worker)) {
            lease.started.get_or_insert(at);
        }
    }

    /// Bills a lease a rejoining worker kept: one already open (the same
    /// worker on a new connection) runs on from when it started.
    pub fn lease_adopted(
        &mut self,
        task: TaskKey,
        worker: WorkerId,
        usd_per_hour: f64,
        now: Millis,
    ) {
        let earlier = (self.open.keys())
            .find(|(t, _)| *t == task)
            .copied()
            .and_then(|key| self.open.remove(&key));
        let lease = earlier.unwrap_or(OpenLease {
            worker,
            usd_per_hour,
            started: Some(now),
        });
        self.open
            .insert((task, worker), OpenLease { worker, ..lease });
    }

    /// Ends a lease (result accepted when `finished`); returns what it cost.
    pub fn lease_ended(
        &mut self,
        task: TaskKey,
        worker: WorkerId,
        finished: bool,
        now: Millis,
    ) -> f64 {
        let Some(lease) = self.open.remove(&(task, worker)) else {
            return 0.0;
        };
        let c = cost(lease.usd_per_hour, lease.started, now);
        let job = self.jobs.entry(task.job).or_default();
        job.closed_usd += c;
        job.finished_tasks += u32::from(finished);
        c
    }

    /// Cost so far: ended leases plus running ones up to `now`.
    pub fn job_cost(&self, job: JobId, now: Millis) -> f64 {
        let closed = self.jobs.get(&job).map_or(0.0, |j| j.closed_usd);
        let running: f64 = self
            .open
            .iter()
            .filter(|((task, _), _)| task.job == job)
            .map(|(_, l)| cost(l.usd_per_hour, l.started, now))
            .sum();
        closed + running
    }

    /// Ended-lease cost only (what is persisted).
    pub fn closed_cost(&self, job: JobId) -> f64 {
        self.jobs.get(&job).map_or(0.0, |j| j.closed_usd)
    }

    /// Remaining tasks at the observed cost per finished task.
    pub fn cost_to_finish(&self, job: JobId, remaining_tasks: u32, now: Millis) -> Option<f64> {
        let j = self.jobs.get(&job)?;
        (j.finished_tasks > 0).then(|| {
            self.job_cost(job, now) / f64::from(j.finished_tasks) * f64::from(remaining_tasks)
        })
    }

    /// Whether `worker` is being billed for any lease.
    pub fn is_busy(&self, worker: WorkerId) -> bool {
        self.open.values().any(|l| l.worker == worker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(job: JobId, index: u32) -> TaskKey {
        TaskKey { job, index }
    }

    #[test]
    fn job_cost_is_the_sum_of_lease_time_times_price() {
        let mut l = Ledger::default();
        // Worker 1 at $3.60/h, worker 2 at $0.72/h.
        l.lease_started(key(1, 0), 1, 3.60, 0);
        l.lease_started(key(1, 1), 2, 0.72, 0);
        assert!((l.lease_ended(key(1, 0), 1, true, 10_000) - 0.01).abs() < 1e-12); // 10 s × $3.60/h
        assert!((l.job_cost(1, 20_000) - (0.01 + 0.004)).abs() < 1e-12); // + 20 s × $0.72/h running
                                                                         // An expired lease still held the worker: it is billed, but not a finished task.
        assert!((l.lease_ended(key(1, 1), 2, false, 25_000) - 0.005).abs() < 1e-12);
        l.lease_started(key(1, 1), 1, 3.60, 25_000);
        l.lease_ended(key(1, 1), 1, true, 30_000);
        let want = 10.0 * 3.60 / 3600.0 + 25.0 * 0.72 / 3600.0 + 5.0 * 3.60 / 3600.0;
        assert!((l.job_cost(1, 99_000) - want).abs() < 1e-12);
        assert!((l.closed_cost(1) - want).abs() < 1e-12);
        // Two finished tasks cost `want`; eight more at that rate.
        assert!((l.cost_to_finish(1, 8, 99_000).unwrap() - want * 4.0).abs() < 1e-12);
        assert_eq!(l.cost_to_finish(2, 8, 0), None);
        assert!(!l.is_busy(1));
        // Ending an unknown lease costs nothing.
        assert_eq!(l.lease_ended(key(3, 0), 1, true, 1), 0.0);
    }

    #[test]
    fn a_queued_lease_is_billed_from_when_it_renders() {
        let mut l = Ledger::default();
        // One slot at $3.60/h renders task 0 for 10 s while task 1 waits
        // queued behind it, then renders task 1 for 10 s.
        l.lease_started(key(1, 0), 1, 3.60, 0);
        l.lease_queued(key(1, 1), 1, 3.60);
        assert!((l.job_cost(1, 5_000) - 0.005).abs() < 1e-12);
        l.lease_ended(key(1, 0), 1, true, 10_000);
        l.lease_rendering(key(1, 1), 1, 10_000);
        l.lease_ended(key(1, 1), 1, true, 20_000);
        assert!((l.closed_cost(1) - 0.02).abs() < 1e-12, "20 s of one slot");
        // A queued lease handed back before it rendered costs nothing.
        l.lease_queued(key(1, 2), 1, 3.60);
        assert_eq!(l.lease_ended(key(1, 2), 1, false, 30_000), 0.0);
    }

    #[test]
    fn both_attempts_of_a_straggler_are_billed() {
        let mut l = Ledger::default();
        // The first attempt runs 100 s on a $36/h worker; a second starts at
        // 60 s on a $3.60/h one and wins at 100 s.
        l.lease_started(key(1, 0), 1, 36.0, 0);
        l.lease_started(key(1, 0), 2, 3.60, 60_000);
        l.lease_ended(key(1, 0), 2, true, 100_000);
        l.lease_ended(key(1, 0), 1, false, 100_000);
        let want = 100.0 * 36.0 / 3600.0 + 40.0 * 3.60 / 3600.0;
        assert!((l.closed_cost(1) - want).abs() < 1e-12);
        assert_eq!(l.cost_to_finish(1, 1, 100_000), Some(want));
    }

    #[test]
    fn an_adopted_lease_is_billed_from_its_start() {
        let mut l = Ledger::default();
        l.lease_started(key(1, 0), 1, 3.60, 0);
        // The same worker reconnects as worker 5 and keeps the task.
        l.lease_adopted(key(1, 0), 5, 3.60, 4_000);
        assert!(!l.is_busy(1) && l.is_busy(5));
        assert!((l.lease_ended(key(1, 0), 5, true, 10_000) - 0.01).abs() < 1e-12);
        // After a coordinator restart nothing was open: billed from adoption.
        l.lease_adopted(key(1, 1), 5, 3.60, 20_000);
        assert!((l.lease_ended(key(1, 1), 5, true, 30_000) - 0.01).abs() < 1e-12);
    }
}
