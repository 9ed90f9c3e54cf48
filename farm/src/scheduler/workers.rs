//! Workers in the scheduler: joining, heartbeats and silence, draining,
//! leaving (their tasks go back to the queue), the identity tag a task
//! exclusion follows, and the trusted slots a worker earns by delivering.

use super::*;

impl Scheduler {
    /// Adds a worker with `slots` concurrent tasks for the given engines. A
    /// known worker re-registering gets the new slots and engines and keeps
    /// its leases.
    pub fn add_worker(&mut self, worker: WorkerId, slots: u32, engines: Vec<String>, now: Millis) {
        match self.workers.entry(worker) {
            btree_map::Entry::Occupied(entry) => {
                let known = entry.into_mut();
                known.slots = slots;
                known.engines = engines;
                known.last_seen = now;
            }
            btree_map::Entry::Vacant(entry) => {
                entry.insert(Worker {
                    slots,
                    proven: 0,
                    tag: worker,
                    engines,
                    leases: BTreeSet::new(),
                    last_seen: now,
                    draining: false,
                    rtt_ms: 0,
                    task_ms: None,
                });
            }
        }
    }

    /// Removes a worker (it left, was preempted or lost its connection). Its
    /// leases end at once and their tasks go back to the front of their jobs'
    /// queues; returns those tasks in order.
    pub fn remove_worker(&mut self, worker: WorkerId, now: Millis) -> Vec<TaskKey> {
        self.tick(now);
        self.affinity.held.remove(&worker);
        self.blender_offers.remove(&worker);
        self.host_facts.remove(&worker);
        let Some(removed) = self.workers.remove(&worker) else {
            return Vec::new();
        };
        let tasks: Vec<TaskKey> = removed.leases.into_iter().collect();
        let mut requeue = Vec::new();
        for &task in &tasks {
            if self.leases.get(&task).is_some_and(|l| l.worker == worker) {
                self.end_lease(task);
                if !self.promote_backup(task) {
                    requeue.push(task);
                }
            } else {
                self.end_backup(task);
            }
        }
        self.requeue_front(requeue);
        tasks
    }

    /// Renews every lease `worker` holds until `now + lease_ms`.
    /// Returns true when the worker had been silent for a whole lease: it
    /// takes work again from now on, so the caller should call `assign`.
    pub fn heartbeat(&mut self, worker: WorkerId, now: Millis) -> bool {
        let lease_ms = self.config.lease_ms;
        let Some(known) = self.workers.get_mut(&worker) else {
            return false;
        };
        let was_silent = known.is_silent(now, lease_ms);
        known.last_seen = now;
        let known = &*known;
        let deadline = now.saturating_add(self.config.lease_ms);
        for &task in &known.leases {
            let (lease, attempt) = match self.leases.get_mut(&task) {
                Some(lease) if lease.worker == worker => (lease, Attempt::Primary),
                _ => (
                    (self.backups.get_mut(&task)).expect("a worker's lease is in a lease table"),
                    Attempt::Backup,
                ),
            };
            self.deadlines.remove(&(lease.deadline, task, attempt));
            lease.deadline = deadline;
            self.deadlines.insert((deadline, task, attempt));
        }
        was_silent
    }

    /// The worker takes no new work from now on; its leases run out
    /// normally, except those queued behind its render slots: they end and
    /// go back to the front of their queues (see
    /// [`Scheduler::take_superseded`]).
    pub fn drain_worker(&mut self, worker: WorkerId) -> bool {
        let Some(known) = self.workers.get_mut(&worker) else {
            return false;
        };
        known.draining = true;
        self.hand_back_queued(worker, None);
        true
    }

    /// Whether the worker was silent for a whole lease as of `now`.
    pub fn is_silent(&self, worker: WorkerId, now: Millis) -> bool {
        self.workers
            .get(&worker)
            .is_some_and(|w| w.is_silent(now, self.config.lease_ms))
    }

    /// Names the worker's connection by `tag` (see [`Tag`]); a new worker
    /// is tagged by its own id.
    pub fn set_worker_tag(&mut self, worker: WorkerId, tag: Tag) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.tag = tag;
        }
    }

    /// The leases `worker` may hold at once now (see [`TRUSTED_SLOTS`]).
    pub fn usable_slots(&self, worker: WorkerId) -> u32 {
        self.workers.get(&worker).map_or(0, |w| w.usable_slots())
    }

    /// Whether some connected worker that takes work is tagged `tag`.
    pub fn connected_tags(&self) -> Vec<(WorkerId, Tag)> {
        (self.workers.iter())
            .filter(|(_, w)| !w.draining)
            .map(|(&id, w)| (id, w.tag))
            .collect()
    }

    pub(super) fn proved(&mut self, worker: WorkerId) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.proven = w.proven.saturating_add(1);
        }
        self.promote_queued(worker);
    }

    /// Whether `worker` holds the current lease of `task` under `epoch`.
    pub(super) fn seen(&mut self, worker: WorkerId, now: Millis) {
        if let Some(known) = self.workers.get_mut(&worker) {
            known.last_seen = known.last_seen.max(now);
        }
    }
}
