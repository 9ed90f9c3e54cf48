//! Pipelined leases: a worker holds, behind each render slot, the next tasks
//! it will render, so it fetches their files without waiting a round trip.
//! Queued leases move up to a free slot in the order they were given, an
//! idle worker steals a queued task from a busy one, and a draining worker
//! hands its queued tasks back.

use super::*;

impl Scheduler {
    /// Turns pipelined leases on or off (off by default). With them on, a
    /// worker holds, besides a task for each render slot, the next tasks
    /// of each slot ([`MAX_AHEAD_PER_SLOT`] at most, as many as its
    /// round trip takes task times), so it fetches their files and starts
    /// them without waiting for a round trip. A queued task is never stuck
    /// behind a busy slot: a worker with an idle slot and nothing else to
    /// do steals it, and a draining worker hands its queued tasks back.
    pub fn set_pipelining(&mut self, on: bool) {
        self.pipelining = on;
    }

    /// `worker`'s connection's round-trip time, for its lease depth.
    pub fn set_worker_rtt(&mut self, worker: WorkerId, rtt_ms: Millis) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.rtt_ms = rtt_ms;
        }
    }

    /// Leases `worker` may hold queued behind its render slots now.
    pub(super) fn ahead_of(&self, worker: &Worker) -> u32 {
        if self.pipelining {
            worker.ahead()
        } else {
            0
        }
    }

    /// Queued leases that moved up to a render slot since the last call,
    /// each with when it did: the worker starts rendering it then (billing
    /// starts there).
    pub fn take_promoted(&mut self) -> Vec<(Assignment, Millis)> {
        std::mem::take(&mut self.promoted)
    }

    /// Whether `worker`'s lease on `task` waits behind its render slots.
    pub fn is_queued(&self, worker: WorkerId, task: TaskKey) -> bool {
        (self.leases.get(&task).filter(|l| l.worker == worker))
            .or_else(|| self.backups.get(&task).filter(|l| l.worker == worker))
            .is_some_and(|l| l.queued)
    }

    /// How many of `worker`'s leases render now (are not queued).
    pub(super) fn rendering(&self, worker: WorkerId) -> usize {
        let Some(w) = self.workers.get(&worker) else {
            return 0;
        };
        (w.leases.iter())
            .filter(|&&t| self.lease_of(worker, t).is_some_and(|l| !l.queued))
            .count()
    }

    /// Moves `worker`'s oldest queued leases up to its free render slots:
    /// the worker renders its tasks in the order it was given them.
    pub(super) fn promote_queued(&mut self, worker: WorkerId) {
        let Some(w) = self.workers.get(&worker) else {
            return;
        };
        let usable = w.usable_slots() as usize;
        let rendering = self.rendering(worker);
        if rendering >= usable {
            return;
        }
        let mut queued: Vec<(Epoch, TaskKey)> = (w.leases.iter())
            .filter_map(|&t| {
                let l = self.lease_of(worker, t)?;
                l.queued.then_some((l.epoch, t))
            })
            .collect();
        queued.sort_unstable();
        let clock = self.clock;
        for (epoch, task) in queued.into_iter().take(usable - rendering) {
            let lease = self.lease_of_mut(worker, task).expect("listed above");
            lease.queued = false;
            lease.started = clock;
            self.promoted.push((
                Assignment {
                    worker,
                    task,
                    epoch,
                },
                clock,
            ));
        }
    }

    /// Ends `worker`'s leases queued behind its render slots (of `job`
    /// only, with `Some`) and puts their tasks back at the front of their
    /// queues; the worker is told to drop them (see
    /// [`Scheduler::take_superseded`]).
    pub fn hand_back_queued(&mut self, worker: WorkerId, job: Option<JobId>) {
        let Some(known) = self.workers.get(&worker) else {
            return;
        };
        let queued: Vec<TaskKey> = (known.leases.iter().copied())
            .filter(|&t| job.is_none_or(|j| t.job == j))
            .filter(|&t| {
                self.leases
                    .get(&t)
                    .is_some_and(|l| l.worker == worker && l.queued)
            })
            .collect();
        for &task in &queued {
            let lease = self.end_lease(task).expect("listed from the lease table");
            self.superseded.push(Assignment {
                worker,
                task,
                epoch: lease.epoch,
            });
        }
        self.requeue_front(queued);
    }

    /// Gives each worker with an idle render slot, once no queue has a
    /// task for it, the task queued last behind another worker's busy
    /// slots (its old lease ends: see [`Scheduler::take_superseded`]).
    pub(super) fn steal(&mut self, now: Millis, assignments: &mut Vec<Assignment>) {
        let idle: Vec<WorkerId> = (self.workers.iter())
            .filter(|(_, w)| w.has_free_slot() && !w.is_silent(now, self.config.lease_ms))
            .map(|(&id, _)| id)
            .collect();
        for thief in idle {
            while self.workers[&thief].has_free_slot() {
                let Some((task, victim)) = self.queued_for(thief) else {
                    break;
                };
                let old = self.end_lease(task).expect("listed from the lease table");
                self.superseded.push(Assignment {
                    worker: victim,
                    task,
                    epoch: old.epoch,
                });
                let job = self.jobs.get_mut(&task.job).expect("a leased task's job");
                job.running += 1;
                let epoch = Epoch(self.next_epoch);
                self.next_epoch += 1;
                self.grant(task, thief, epoch, now, Attempt::Primary);
                assignments.push(Assignment {
                    worker: thief,
                    task,
                    epoch,
                });
            }
        }
    }

    /// The queued lease `thief` may take over: of a job it can render, on
    /// another worker, the one granted last (the last in its queue).
    pub(super) fn queued_for(&self, thief: WorkerId) -> Option<(TaskKey, WorkerId)> {
        let w = &self.workers[&thief];
        (self.leases.iter())
            .filter(|(task, lease)| {
                let job = &self.jobs[&task.job];
                lease.queued
                    && lease.worker != thief
                    && !self.backups.contains_key(task)
                    && job.state.is_live()
                    && !job.paused
                    && w.engines.contains(&job.engine)
                    && self.fits(thief, task.job)
                    && !job.blocklist.contains(&thief)
                    && !job.is_excluded(task.index, w.tag)
            })
            .max_by_key(|(_, lease)| lease.epoch)
            .map(|(&task, lease)| (task, lease.worker))
    }
}
