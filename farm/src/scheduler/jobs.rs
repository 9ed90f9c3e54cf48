//! Jobs in the scheduler: adding them, their state and progress, holding and
//! releasing tasks, pausing, cancelling and forgetting, and the per-job
//! exclusions and blocklists that keep a task away from workers that failed
//! it.

use super::*;

impl Scheduler {
    /// Adds a job. A job with no pending task is `Done` at once. Adding an id
    /// that is already known does nothing (submission is idempotent).
    pub fn add_job(&mut self, job: NewJob, _now: Millis) {
        if self.jobs.contains_key(&job.id) {
            return;
        }
        let mut pending = job.pending;
        pending.retain(|&index| index < job.total);
        pending.sort_unstable();
        pending.dedup();
        let mut done = vec![true; job.total as usize];
        for &index in &pending {
            done[index as usize] = false;
        }
        let entry = Job {
            rank: (Reverse(job.priority), job.submit_seq, job.id),
            engine: job.engine,
            state: if pending.is_empty() {
                JobState::Done
            } else {
                JobState::Queued
            },
            done_count: job.total - pending.len() as u32,
            done,
            running: 0,
            queue: pending.into(),
            backoff: HashMap::new(),
            failures: HashMap::new(),
            paused: false,
            errors: HashMap::new(),
            last_error: None,
            worker_failures: HashMap::new(),
            failed_on: HashMap::new(),
            blocklist: HashSet::new(),
            held: HashSet::new(),
            excluded: HashMap::new(),
            done_ms_sum: 0,
            done_ms_count: 0,
        };
        sync_ready(&mut self.ready, &entry);
        self.jobs.insert(job.id, entry);
    }

    /// Cancels a queued or running job: it hands out no more tasks and its
    /// results are refused. Returns the leases the server must tell workers
    /// to drop. A job that is unknown or already over is left as it is.
    pub fn cancel_job(&mut self, job: JobId) -> Vec<Assignment> {
        match self.jobs.get(&job) {
            Some(known) if known.state.is_live() => self.stop_job(job, JobState::Canceled),
            _ => Vec::new(),
        }
    }

    /// Forgets a job that is over (done, failed or canceled), so memory
    /// follows active work; it is then unknown, like one never added.
    /// Returns false, changing nothing, for a live or unknown job.
    pub fn forget_job(&mut self, job: JobId) -> bool {
        if self.jobs.get(&job).is_none_or(|j| j.state.is_live()) {
            return false;
        }
        self.jobs.remove(&job);
        self.affinity.assets.remove(&job);
        self.host_needs.remove(&job);
        self.retries.retain(|(_, task)| task.job != job);
        // Tables sized for a peak of live jobs give the room back once most
        // of them are over.
        shrink_when_sparse(&mut self.jobs);
        shrink_when_sparse(&mut self.affinity.assets);
        true
    }

    pub fn job_state(&self, job: JobId) -> Option<JobState> {
        self.jobs.get(&job).map(|known| known.state.clone())
    }

    pub fn job_progress(&self, job: JobId) -> Option<JobProgress> {
        self.jobs.get(&job).map(|known| JobProgress {
            total: known.total(),
            done: known.done_count,
            running: known.running,
            queued: (known.queue.len() + known.backoff.len() + known.held.len()) as u32,
        })
    }

    /// Holds back `job`'s queued tasks `indices`: they are handed out only
    /// once released (and count as queued meanwhile). Indices that are not
    /// queued are left as they are.
    pub fn hold(&mut self, job: JobId, indices: &[u32]) {
        let Some(known) = self.jobs.get_mut(&job) else {
            return;
        };
        let hold: HashSet<u32> = indices.iter().copied().collect();
        known
            .queue
            .retain(|i| !hold.contains(i) || !known.held.insert(*i));
        sync_ready(&mut self.ready, known);
    }

    /// Queues a held task next in line; false when it was not held (or its
    /// job is over).
    pub fn release_held(&mut self, task: TaskKey) -> bool {
        let Some(job) = self.jobs.get_mut(&task.job) else {
            return false;
        };
        if !job.held.remove(&task.index) || !job.state.is_live() {
            return false;
        }
        job.queue.push_front(task.index);
        sync_ready(&mut self.ready, job);
        true
    }

    /// Gives a live job a new priority: it is ranked by it from its next
    /// lease on (leases handed out stay). False for an unknown or finished
    /// job.
    pub fn set_priority(&mut self, job: JobId, priority: i32) -> bool {
        let Some(known) = self.jobs.get_mut(&job).filter(|j| j.state.is_live()) else {
            return false;
        };
        if let Some(ranks) = self.ready.get_mut(&known.engine) {
            ranks.remove(&known.rank);
        }
        known.rank.0 = Reverse(priority);
        sync_ready(&mut self.ready, known);
        true
    }

    /// Pauses or resumes a live job: a paused job hands out no new leases;
    /// running ones go on, queued ones (pipelined, not started) are handed
    /// back. Returns false for an unknown or finished job.
    pub fn pause_job(&mut self, job: JobId, paused: bool) -> bool {
        let Some(known) = self.jobs.get_mut(&job).filter(|j| j.state.is_live()) else {
            return false;
        };
        known.paused = paused;
        sync_ready(&mut self.ready, known);
        if paused {
            // Its tasks queued behind render slots have not started: they
            // go back to its queue, so that a pause stops the job once the
            // running ones end (see [`Scheduler::take_superseded`]).
            let holders: Vec<WorkerId> = (self.workers.iter())
                .filter(|(_, w)| w.leases.iter().any(|t| t.job == job))
                .map(|(&id, _)| id)
                .collect();
            for worker in holders {
                self.hand_back_queued(worker, Some(job));
            }
        }
        true
    }

    /// Ends a live job as `state`: its leases end and its queue empties.
    pub(super) fn stop_job(&mut self, job_id: JobId, state: JobState) -> Vec<Assignment> {
        let first = TaskKey {
            job: job_id,
            index: 0,
        };
        let last = TaskKey {
            job: job_id,
            index: u32::MAX,
        };
        let tasks: Vec<TaskKey> = self
            .leases
            .range(first..=last)
            .map(|(&task, _)| task)
            .collect();
        let mut ended = Vec::with_capacity(tasks.len());
        for task in tasks {
            let lease = self.end_lease(task).expect("listed from the lease table");
            let backup = self.end_backup(task);
            for lease in [Some(lease), backup].into_iter().flatten() {
                ended.push(Assignment {
                    worker: lease.worker,
                    task,
                    epoch: lease.epoch,
                });
            }
        }
        let job = self
            .jobs
            .get_mut(&job_id)
            .expect("the caller checked the job");
        job.state = state;
        job.queue.clear();
        job.backoff.clear();
        job.held.clear();
        sync_ready(&mut self.ready, job);
        ended
    }

    /// Gives `task` to no worker tagged `tag` from now on.
    pub fn exclude(&mut self, task: TaskKey, tag: Tag) {
        if let Some(job) = self.jobs.get_mut(&task.job) {
            let tags = job.excluded.entry(task.index).or_default();
            if !tags.contains(&tag) {
                tags.push(tag);
            }
        }
    }

    /// Marks a done task of a live job as not done and queues it first: its
    /// result was withdrawn (its worker was caught returning wrong pixels).
    /// Returns false, changing nothing, when the task is not done.
    pub fn reopen(&mut self, task: TaskKey) -> bool {
        let Some(job) = self.jobs.get_mut(&task.job) else {
            return false;
        };
        if !job.done.get(task.index as usize).copied().unwrap_or(false)
            || !matches!(job.state, JobState::Running | JobState::Done)
        {
            return false;
        }
        job.done[task.index as usize] = false;
        job.done_count -= 1;
        job.state = JobState::Running;
        self.requeue(task, Requeue::Front);
        true
    }

    /// [`Scheduler::reopen`], the task handed out again only from `at`
    /// (its result refused by an outage), counting no attempt.
    pub fn reopen_at(&mut self, task: TaskKey, at: Millis) -> bool {
        if !self.reopen(task) {
            return false;
        }
        let job = self.jobs.get_mut(&task.job).expect("reopened above");
        if let Some(i) = job.queue.iter().position(|&i| i == task.index) {
            job.queue.remove(i);
            sync_ready(&mut self.ready, job);
        }
        job.backoff.insert(task.index, at);
        self.retries.insert((at, task));
        true
    }

    /// Queued tasks of `job` that only a worker with none of their excluded
    /// tags may take, with those tags: what a check waits for.
    pub fn excluded_queued(&self, job: JobId) -> Vec<(u32, Vec<Tag>)> {
        let Some(j) = self.jobs.get(&job) else {
            return Vec::new();
        };
        (j.queue.iter())
            .filter_map(|i| j.excluded.get(i).map(|t| (*i, t.clone())))
            .collect()
    }

    /// The error of `job`'s most recent failed attempt, if any.
    pub fn last_error(&self, job: JobId) -> Option<&str> {
        let j = self.jobs.get(&job)?;
        j.last_error.as_deref()
    }

    /// Gives `worker` no more of `job`'s tasks (it cannot render them).
    pub fn blocklist(&mut self, job: JobId, worker: WorkerId) {
        if let Some(j) = self.jobs.get_mut(&job) {
            j.blocklist.insert(worker);
        }
    }

    /// Whether `worker` failed too often to get more of `job`'s tasks.
    pub fn is_blocklisted(&self, job: JobId, worker: WorkerId) -> bool {
        self.jobs
            .get(&job)
            .is_some_and(|j| j.blocklist.contains(&worker))
    }

    /// Where one task stands.
    pub fn task_view(&self, task: TaskKey) -> Option<TaskView> {
        let job = self
            .jobs
            .get(&task.job)
            .filter(|j| task.index < j.total())?;
        Some(TaskView {
            done: job.done[task.index as usize],
            lease: self.leases.get(&task).map(|l| (l.worker, l.epoch)),
            failures: job.failures.get(&task.index).copied().unwrap_or(0),
        })
    }
}
