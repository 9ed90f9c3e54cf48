//! Handing out work: each round visits every worker with room once, picks the
//! best job it can run (priority, then age; Blender fit and cache affinity),
//! and leases it the next task under a fresh epoch. Idle workers then run
//! backups of stragglers, and failed tasks come back out of their backoff.

use super::*;

impl Scheduler {
    /// Fills every free slot that some queued task can use. Each worker gets
    /// the first task it can render in job order (priority, submission, task
    /// index); workers take turns one task at a time, starting after the
    /// worker served last, so work spreads over the farm. A worker silent for
    /// a whole lease gets nothing until it is heard from again.
    pub fn assign(&mut self, now: Millis) -> Vec<Assignment> {
        self.tick(now);
        self.release_retries(now);
        let start = self.last_served.map_or(0, |id| id.wrapping_add(1));
        let mut turns: VecDeque<WorkerId> = (self.workers.range(start..))
            .chain(self.workers.range(..start))
            .filter(|(_, worker)| {
                worker.has_room(self.ahead_of(worker))
                    && !worker.is_silent(now, self.config.lease_ms)
            })
            .map(|(&id, _)| id)
            .collect();
        let mut assignments = Vec::new();
        while let Some(worker) = turns.pop_front() {
            // It may have been filled by affinity since it joined the turns.
            let w = &self.workers[&worker];
            if !w.has_room(self.ahead_of(w)) {
                continue;
            }
            let Some(job) = self.best_job_for(worker) else {
                continue;
            };
            let target = self.affine_worker(job, worker, &turns, now);
            assignments.push(self.lease_next_task(job, target, now));
            self.last_served = Some(target);
            if target != worker {
                // The task went to a worker holding more of its job's assets;
                // this one still has a free slot and takes the next turn.
                turns.push_front(worker);
            } else if self.workers[&worker].has_room(self.ahead_of(&self.workers[&worker])) {
                turns.push_back(worker);
            }
        }
        if self.pipelining {
            self.steal(now, &mut assignments);
        }
        self.speculate(now, &mut assignments);
        assignments
    }

    /// Gives each worker still idle a second attempt of the longest-running
    /// straggler it can render (see [`Config::straggler_percent`]).
    pub(super) fn speculate(&mut self, now: Millis, assignments: &mut Vec<Assignment>) {
        if self.config.straggler_percent == 0 || self.leases.is_empty() {
            return;
        }
        let idle: Vec<WorkerId> = (self.workers.iter())
            .filter(|(_, w)| w.has_free_slot() && !w.is_silent(now, self.config.lease_ms))
            .map(|(&id, _)| id)
            .collect();
        for worker in idle {
            let Some(task) = self.straggler_for(worker, now) else {
                continue;
            };
            let epoch = Epoch(self.next_epoch);
            self.next_epoch += 1;
            self.grant(task, worker, epoch, now, Attempt::Backup);
            assignments.push(Assignment {
                worker,
                task,
                epoch,
            });
        }
    }

    /// The longest-running task that is a straggler and that `worker` may
    /// take a second attempt of.
    pub(super) fn straggler_for(&self, worker: WorkerId, now: Millis) -> Option<TaskKey> {
        let engines = &self.workers[&worker].engines;
        let percent = u64::from(self.config.straggler_percent);
        (self.leases.iter())
            .filter(|(task, lease)| {
                let job = &self.jobs[&task.job];
                let running = now.saturating_sub(lease.started);
                lease.worker != worker
                    && !lease.queued
                    && !self.backups.contains_key(task)
                    && job.state.is_live()
                    && !job.paused
                    && job.queue.is_empty()
                    && job.backoff.is_empty()
                    && job.done_ms_count >= STRAGGLER_MIN_SAMPLES
                    && engines.contains(&job.engine)
                    && self.fits(worker, task.job)
                    && !job.blocklist.contains(&worker)
                    && !job.is_excluded(task.index, self.workers[&worker].tag)
                    && running >= STRAGGLER_MIN_MS
                    && running * 100 * u64::from(job.done_ms_count) >= percent * job.done_ms_sum
            })
            .max_by_key(|(_, lease)| now.saturating_sub(lease.started))
            .map(|(&task, _)| task)
    }

    /// The live job that comes first among those `worker` can render.
    pub(super) fn best_job_for(&self, worker: WorkerId) -> Option<JobId> {
        let engines = &self.workers[&worker].engines;
        engines
            .iter()
            .filter_map(|engine| {
                self.ready.get(engine)?.iter().find(|&&(_, _, job)| {
                    let j = &self.jobs[&job];
                    !j.blocklist.contains(&worker)
                        && self.fits(worker, job)
                        && j.has_task_for(self.workers[&worker].tag)
                })
            })
            .min()
            .map(|&(_, _, job)| job)
    }

    pub(super) fn lease_next_task(
        &mut self,
        job_id: JobId,
        worker: WorkerId,
        now: Millis,
    ) -> Assignment {
        let tag = self.workers[&worker].tag;
        let job = self.jobs.get_mut(&job_id).expect("a ready job exists");
        // A retry goes to another worker when one of the next few tasks is
        // not one this worker already failed; a task excluded for it (its
        // result is being checked) never does.
        let failed_here = |i: &u32| job.failed_on.get(i).is_some_and(|w| w.contains(&worker));
        let excluded = |i: &u32| job.is_excluded(*i, tag);
        let near = || job.queue.iter().take(64);
        let pos = (near().position(|i| !failed_here(i) && !excluded(i)))
            .or_else(|| near().position(|i| !excluded(i)))
            .expect("the caller checked that the job has a task for this worker");
        let index = job
            .queue
            .remove(pos)
            .expect("a ready job has a queued task");
        job.running += 1;
        if job.state == JobState::Queued {
            job.state = JobState::Running;
        }
        sync_ready(&mut self.ready, job);
        let task = TaskKey { job: job_id, index };
        let epoch = Epoch(self.next_epoch);
        self.next_epoch += 1;
        self.grant(task, worker, epoch, now, Attempt::Primary);
        Assignment {
            worker,
            task,
            epoch,
        }
    }

    /// Records a lease; a first attempt is counted as running by the
    /// caller.
    pub(super) fn grant(
        &mut self,
        task: TaskKey,
        worker: WorkerId,
        epoch: Epoch,
        now: Millis,
        attempt: Attempt,
    ) {
        let deadline = now.saturating_add(self.config.lease_ms);
        let queued = self.pipelining
            && self.rendering(worker) >= self.workers[&worker].usable_slots() as usize;
        let lease = Lease {
            worker,
            epoch,
            deadline,
            started: now,
            queued,
        };
        match attempt {
            Attempt::Primary => self.leases.insert(task, lease),
            Attempt::Backup => self.backups.insert(task, lease),
        };
        self.deadlines.insert((deadline, task, attempt));
        self.workers
            .get_mut(&worker)
            .expect("leases go to known workers")
            .leases
            .insert(task);
    }

    /// Queues again the failed tasks whose backoff ended by `now`.
    pub(super) fn release_retries(&mut self, now: Millis) {
        while let Some(&(at, task)) = self.retries.first() {
            if at > now {
                break;
            }
            self.retries.pop_first();
            let Some(job) = self.jobs.get_mut(&task.job) else {
                continue;
            };
            // Skipped when the job ended or the task was adopted meanwhile.
            if job.backoff.get(&task.index) == Some(&at) {
                job.backoff.remove(&task.index);
                if job.state.is_live() {
                    self.requeue(task, Requeue::Back);
                }
            }
        }
    }
}
