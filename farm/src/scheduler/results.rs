//! Results and leases: a result is accepted only from the worker holding the
//! task's current lease with that lease's epoch; failures are retried with
//! backoff up to the job's attempt limit; expired leases go back to the front
//! of their job's queue; leases a restarted coordinator finds on reconnecting
//! workers are adopted.

use super::*;

impl Scheduler {
    /// Accepts the result of `task` from the worker holding its current lease
    /// under `epoch`. Anything else is refused and changes nothing.
    pub fn complete(
        &mut self,
        worker: WorkerId,
        task: TaskKey,
        epoch: Epoch,
        now: Millis,
    ) -> Result<Accepted, Refused> {
        let attempt = self.check_lease(worker, task, epoch)?;
        self.tick(now);
        // The winner's lease ends, and the other attempt's, if any, loses.
        let (won, lost) = match attempt {
            Attempt::Primary => (self.end_lease(task), self.end_backup(task)),
            Attempt::Backup => (self.end_backup(task), self.end_lease(task)),
        };
        let won = won.expect("checked above");
        if let Some(lost) = lost {
            self.superseded.push(Assignment {
                worker: lost.worker,
                task,
                epoch: lost.epoch,
            });
        }
        self.seen(worker, now);
        let took = now.saturating_sub(won.started);
        if let Some(w) = self.workers.get_mut(&worker) {
            w.task_ms = Some(w.task_ms.map_or(took, |t| (3 * t + took) / 4));
        }
        self.proved(worker);
        let job = self.jobs.get_mut(&task.job).expect("checked above");
        job.done_ms_sum += took;
        job.done_ms_count += 1;
        job.done[task.index as usize] = true;
        job.done_count += 1;
        let job_done = job.done_count == job.total();
        if job_done {
            job.state = JobState::Done;
        }
        Ok(Accepted::TaskDone { job_done })
    }

    /// Accepts a failed attempt of `task`, under the same rules as
    /// [`Scheduler::complete`]. The task is retried until it has failed
    /// `max_attempts` times; then the job fails with `error` and its other
    /// leases end. An expired lease is not a failed attempt.
    pub fn fail(
        &mut self,
        worker: WorkerId,
        task: TaskKey,
        epoch: Epoch,
        error: String,
        now: Millis,
    ) -> Result<FailOutcome, Refused> {
        let attempt = self.check_lease(worker, task, epoch)?;
        self.tick(now);
        // A failed second attempt leaves the first running; a failed first
        // attempt hands the task to the second, if there is one.
        let carried_on = match attempt {
            Attempt::Backup => {
                self.end_backup(task);
                true
            }
            Attempt::Primary => {
                self.end_lease(task);
                self.promote_backup(task)
            }
        };
        self.seen(worker, now);
        let job = self.jobs.get_mut(&task.job).expect("checked above");
        let attempts = job.failures.entry(task.index).or_insert(0);
        if attempt == Attempt::Primary {
            *attempts += 1;
        }
        let attempts = *attempts;
        job.last_error = Some(error.clone());
        let errors = job.errors.entry(task.index).or_default();
        errors.push((worker, error));
        job.failed_on.entry(task.index).or_default().push(worker);
        let by_worker = job.worker_failures.entry(worker).or_insert(0);
        *by_worker += 1;
        let blocklisted = *by_worker == BLOCKLIST_AFTER;
        if blocklisted {
            job.blocklist.insert(worker);
        }
        if attempts < self.config.max_attempts.max(1) || attempt == Attempt::Backup {
            let wait = retry_backoff(self.config.retry_backoff_ms, attempts);
            if carried_on {
                // Another attempt is still running: nothing to requeue.
            } else if wait == 0 {
                self.requeue(task, Requeue::Back);
            } else {
                let at = now.saturating_add(wait);
                job.backoff.insert(task.index, at);
                self.retries.insert((at, task));
            }
            return Ok(FailOutcome {
                attempts,
                job_failed: false,
                blocklisted,
                cancel: Vec::new(),
            });
        }
        let collected = collect_errors(errors);
        let cancel = self.stop_job(task.job, JobState::Failed(collected));
        Ok(FailOutcome {
            attempts,
            job_failed: true,
            blocklisted,
            cancel,
        })
    }

    /// Ends every lease whose deadline is at or before `now` and requeues its
    /// task at the front of its job; returns the expired leases.
    pub fn expire(&mut self, now: Millis) -> Vec<Assignment> {
        (self.expire_noting_queued(now).into_iter())
            .map(|(a, _)| a)
            .collect()
    }

    /// [`Scheduler::expire`], each lease with whether it was still queued
    /// behind its worker's slots (never started rendering).
    pub fn expire_noting_queued(&mut self, now: Millis) -> Vec<(Assignment, bool)> {
        self.tick(now);
        let mut expired = Vec::new();
        let mut requeue = Vec::new();
        while let Some(&(deadline, task, attempt)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            let lease = match attempt {
                Attempt::Primary => self.end_lease(task),
                Attempt::Backup => self.end_backup(task),
            };
            let lease = lease.expect("every deadline belongs to a lease");
            if attempt == Attempt::Primary && !self.promote_backup(task) {
                requeue.push(task);
            }
            // A worker that let a lease run out is silent until it is heard
            // from again by a heartbeat (a result alone, seen after its last
            // renewal, does not say it lives): the requeued task must not go
            // straight back to it.
            let lease_ms = self.config.lease_ms;
            if let Some(known) = self.workers.get_mut(&lease.worker) {
                known.last_seen = known.last_seen.min(now.saturating_sub(lease_ms));
            }
            let queued = lease.queued;
            expired.push((
                Assignment {
                    worker: lease.worker,
                    task,
                    epoch: lease.epoch,
                },
                queued,
            ));
        }
        self.requeue_front(requeue);
        expired
    }

    /// Leases that ended because another attempt of their task was
    /// accepted first; tell their workers to stop.
    pub fn take_superseded(&mut self) -> Vec<Assignment> {
        std::mem::take(&mut self.superseded)
    }

    pub(super) fn check_lease(
        &self,
        worker: WorkerId,
        task: TaskKey,
        epoch: Epoch,
    ) -> Result<Attempt, Refused> {
        self.live_task(task)?;
        if (self.backups.get(&task)).is_some_and(|b| b.epoch == epoch && b.worker == worker) {
            return Ok(Attempt::Backup);
        }
        let lease = self.leases.get(&task);
        match lease {
            Some(lease) if lease.epoch == epoch && lease.worker == worker => Ok(Attempt::Primary),
            Some(lease) if lease.epoch == epoch => Err(Refused::NotLeasedToWorker {
                task,
                worker,
                holder: lease.worker,
            }),
            _ => Err(Refused::StaleEpoch {
                task,
                epoch,
                current: lease.map(|lease| lease.epoch),
            }),
        }
    }

    /// `task` exists, is not done, and its job still runs.
    pub(super) fn live_task(&self, task: TaskKey) -> Result<(), Refused> {
        let job = (self.jobs.get(&task.job))
            .filter(|job| task.index < job.total())
            .ok_or(Refused::UnknownTask { task })?;
        if job.done[task.index as usize] {
            return Err(Refused::AlreadyDone { task });
        }
        if !job.state.is_live() {
            return Err(Refused::JobNotRunning {
                job: task.job,
                state: job.state.clone(),
            });
        }
        Ok(())
    }

    /// Removes a lease from every table; the task is then neither running nor
    /// queued until the caller decides.
    pub(super) fn end_lease(&mut self, task: TaskKey) -> Option<Lease> {
        let lease = self.leases.remove(&task)?;
        self.deadlines
            .remove(&(lease.deadline, task, Attempt::Primary));
        if let Some(worker) = self.workers.get_mut(&lease.worker) {
            worker.leases.remove(&task);
        }
        if let Some(job) = self.jobs.get_mut(&task.job) {
            job.running -= 1;
        }
        self.promote_queued(lease.worker);
        Some(lease)
    }

    /// Ends a straggler's second lease; the task's counts do not change.
    pub(super) fn end_backup(&mut self, task: TaskKey) -> Option<Lease> {
        let lease = self.backups.remove(&task)?;
        self.deadlines
            .remove(&(lease.deadline, task, Attempt::Backup));
        if let Some(worker) = self.workers.get_mut(&lease.worker) {
            worker.leases.remove(&task);
        }
        self.promote_queued(lease.worker);
        Some(lease)
    }

    /// After a task's first lease ended without a result: its second
    /// attempt, if any, becomes the first, and the task runs on.
    pub(super) fn promote_backup(&mut self, task: TaskKey) -> bool {
        let Some(lease) = self.backups.remove(&task) else {
            return false;
        };
        self.deadlines
            .remove(&(lease.deadline, task, Attempt::Backup));
        self.deadlines
            .insert((lease.deadline, task, Attempt::Primary));
        self.leases.insert(task, lease);
        if let Some(job) = self.jobs.get_mut(&task.job) {
            job.running += 1;
        }
        true
    }

    pub(super) fn requeue(&mut self, task: TaskKey, end: Requeue) {
        let job = self
            .jobs
            .get_mut(&task.job)
            .expect("a leased task's job exists");
        match end {
            Requeue::Front => job.queue.push_front(task.index),
            Requeue::Back => job.queue.push_back(task.index),
        }
        sync_ready(&mut self.ready, job);
    }

    /// Requeues tasks at the front so that they come back in task order.
    pub(super) fn requeue_front(&mut self, mut tasks: Vec<TaskKey>) {
        tasks.sort_unstable_by(|a, b| b.cmp(a));
        for task in tasks {
            self.requeue(task, Requeue::Front);
        }
    }

    /// Whether `worker` holds a current lease (or a straggler's second
    /// one) on `task` under `epoch`: what it may report on or send a
    /// result for.
    pub fn lease_check(
        &self,
        worker: WorkerId,
        task: TaskKey,
        epoch: Epoch,
    ) -> Result<(), Refused> {
        self.check_lease(worker, task, epoch).map(|_| ())
    }

    /// The leases `worker` holds, in task order.
    pub fn running_on(&self, worker: WorkerId) -> Vec<(TaskKey, Epoch)> {
        let Some(known) = self.workers.get(&worker) else {
            return Vec::new();
        };
        (known.leases.iter())
            .map(|&task| match self.leases.get(&task) {
                Some(lease) if lease.worker == worker => (task, lease.epoch),
                _ => (task, self.backups[&task].epoch),
            })
            .collect()
    }

    /// The epoch the next assignment will get; persist it to seed
    /// [`Config::first_epoch`] after a restart.
    pub fn next_epoch(&self) -> u64 {
        self.next_epoch
    }

    /// Takes over a lease a worker reports holding when it (re)joins, so a
    /// task still rendering there is not rendered again: after a coordinator
    /// restart, or when a worker reconnects before its old connection was
    /// noticed gone. The task must be live and not done, `epoch` one this
    /// farm handed out, and the task either waiting in its job's queue or
    /// leased under that same epoch (then the lease moves to `worker`).
    /// Anything else is refused and changes nothing: the worker should drop
    /// the task.
    pub fn adopt(
        &mut self,
        worker: WorkerId,
        task: TaskKey,
        epoch: Epoch,
        now: Millis,
    ) -> Result<(), Refused> {
        self.live_task(task)?;
        self.tick(now);
        if !self.workers.contains_key(&worker) || epoch.0 >= self.next_epoch {
            return Err(Refused::StaleEpoch {
                task,
                epoch,
                current: self.leases.get(&task).map(|l| l.epoch),
            });
        }
        if self.backups.get(&task).is_some_and(|b| b.epoch == epoch) {
            self.end_backup(task);
            self.grant(task, worker, epoch, now, Attempt::Backup);
            self.seen(worker, now);
            return Ok(());
        }
        match self.leases.get(&task) {
            Some(lease) if lease.epoch == epoch => {
                self.end_lease(task);
            }
            Some(lease) => {
                return Err(Refused::StaleEpoch {
                    task,
                    epoch,
                    current: Some(lease.epoch),
                })
            }
            None => {
                let job = self.jobs.get_mut(&task.job).expect("checked above");
                if job.held.contains(&task.index) {
                    return Err(Refused::Held { task });
                }
                if job.backoff.remove(&task.index).is_none() {
                    let pos = job.queue.iter().position(|&i| i == task.index);
                    job.queue
                        .remove(pos.expect("a live task not done, leased or in backoff is queued"));
                }
            }
        }
        let job = self.jobs.get_mut(&task.job).expect("checked above");
        job.running += 1;
        if job.state == JobState::Queued {
            job.state = JobState::Running;
        }
        sync_ready(&mut self.ready, job);
        self.grant(task, worker, epoch, now, Attempt::Primary);
        self.seen(worker, now);
        Ok(())
    }

    /// Ends `worker`'s lease on `task` under `epoch` without marking the
    /// task done or counting a failure: its result is kept aside to be
    /// checked, or the worker may not deliver it. The task runs on in its
    /// other attempt, if any, or goes back to the front of its queue.
    pub fn release(
        &mut self,
        worker: WorkerId,
        task: TaskKey,
        epoch: Epoch,
        now: Millis,
    ) -> Result<(), Refused> {
        let attempt = self.check_lease(worker, task, epoch)?;
        self.tick(now);
        match attempt {
            Attempt::Backup => {
                self.end_backup(task);
            }
            Attempt::Primary => {
                self.end_lease(task);
                if !self.promote_backup(task) {
                    self.requeue(task, Requeue::Front);
                }
            }
        }
        self.seen(worker, now);
        self.proved(worker);
        Ok(())
    }
}

/// A failed task's attempts as one line: each distinct error once, with the
/// workers that hit it ("worker 3: X" or "workers 3, 5 (3 attempts): X").
pub(super) fn collect_errors(attempts: &[(WorkerId, String)]) -> String {
    let mut distinct: Vec<(&str, Vec<WorkerId>)> = Vec::new();
    for (worker, error) in attempts {
        match distinct.iter_mut().find(|(e, _)| *e == error.as_str()) {
            Some((_, workers)) => workers.push(*worker),
            None => distinct.push((error, vec![*worker])),
        }
    }
    distinct
        .into_iter()
        .map(|(error, workers)| {
            let mut names: Vec<WorkerId> = workers.clone();
            names.sort_unstable();
            names.dedup();
            let names: Vec<String> = names.iter().map(|w| w.to_string()).collect();
            let who = if names.len() == 1 {
                format!("worker {}", names[0])
            } else {
                format!("workers {}", names.join(", "))
            };
            if workers.len() == 1 {
                format!("{who}: {error}")
            } else {
                format!("{who} ({} attempts): {error}", workers.len())
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The wait before the retry that follows failure number `attempts`.
pub(super) fn retry_backoff(base: Millis, attempts: u32) -> Millis {
    let doublings = attempts.saturating_sub(1).min(16);
    base.saturating_mul(1 << doublings)
        .min(MAX_RETRY_BACKOFF_MS)
}
