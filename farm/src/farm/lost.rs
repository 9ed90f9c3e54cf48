//! Tasks whose workers keep dying while they render them. A lease that ends
//! with its worker (connection gone, or silent past its deadline) is only
//! *possibly* lost: a worker cut off by the network comes back holding the
//! task. It counts once the worker is known gone: it came back without the
//! task (its process restarted), or not within [`GONE_AFTER_MS`]. At
//! [`LOST_IN_A_ROW_FAILS`] such losses in a row the job fails with that
//! reason, instead of the render taking down worker after worker forever.
//! Any result or reported failure of the task starts the count again. Pure
//! data, no clock: time comes in as milliseconds.

use std::collections::HashMap;

use crate::scheduler::{Millis, TaskKey};

/// Lost leases in a row after which a task's job fails.
pub const LOST_IN_A_ROW_FAILS: u32 = 3;
/// How long a worker has to come back (reconnect, or heartbeat again)
/// before its ended leases count as lost: longer than its reconnect backoff.
pub const GONE_AFTER_MS: Millis = 10_000;

#[derive(Debug, Default)]
pub(super) struct LostLeases {
    /// Leases ended with their worker, until it returns or the wait ends.
    pending: Vec<Pending>,
    in_a_row: HashMap<TaskKey, u32>,
}

#[derive(Debug, Clone)]
struct Pending {
    task: TaskKey,
    worker: String,
    gone_at: Millis,
}

impl LostLeases {
    /// `worker` (by name) left or went silent holding `task`.
    pub fn ended_with_worker(&mut self, worker: &str, task: TaskKey, now: Millis) {
        self.pending
            .retain(|p| !(p.task == task && p.worker == worker));
        self.pending.push(Pending {
            task,
            worker: worker.to_string(),
            gone_at: now.saturating_add(GONE_AFTER_MS),
        });
    }

    /// `worker` is heard from again (a heartbeat): it was alive.
    pub fn alive(&mut self, worker: &str) {
        if !self.pending.is_empty() {
            self.pending.retain(|p| p.worker != worker);
        }
    }

    /// `worker` rejoined holding `holding`: its other pending leases are
    /// lost (its process restarted); the held ones were not. Returns the
    /// tasks whose loss counts now.
    pub fn rejoined(&mut self, worker: &str, holding: &[TaskKey]) -> Vec<TaskKey> {
        let mut lost = Vec::new();
        self.pending.retain(|p| {
            if p.worker != worker {
                return true;
            }
            if !holding.contains(&p.task) {
                lost.push(p.task);
            }
            false
        });
        lost
    }

    /// The pending leases whose worker did not come back in time.
    pub fn due(&mut self, now: Millis) -> Vec<TaskKey> {
        let mut lost = Vec::new();
        self.pending.retain(|p| {
            let due = p.gone_at <= now;
            if due {
                lost.push(p.task);
            }
            !due
        });
        lost
    }

    /// When [`LostLeases::due`] has something next.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.pending.iter().map(|p| p.gone_at).min()
    }

    /// Counts one more loss of `task`; returns the count in a row.
    pub fn count(&mut self, task: TaskKey) -> u32 {
        let n = self.in_a_row.entry(task).or_insert(0);
        *n += 1;
        *n
    }

    /// Losses of `task` in a row so far.
    #[cfg(test)]
    pub fn in_a_row(&self, task: TaskKey) -> u32 {
        self.in_a_row.get(&task).copied().unwrap_or(0)
    }

    /// The task produced a result or a reported failure.
    pub fn reset(&mut self, task: TaskKey) {
        self.in_a_row.remove(&task);
        self.pending.retain(|p| p.task != task);
    }

    /// The job is over: forget its tasks.
    pub fn forget_job(&mut self, job: u64) {
        self.in_a_row.retain(|t, _| t.job != job);
        self.pending.retain(|p| p.task.job != job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: TaskKey = TaskKey { job: 1, index: 0 };

    #[test]
    fn only_workers_known_gone_count_and_a_result_starts_again() {
        let mut lost = LostLeases::default();
        // Cut off, then heard from again: not lost.
        lost.ended_with_worker("a", T, 0);
        lost.alive("a");
        assert_eq!(lost.due(GONE_AFTER_MS), []);
        // Back holding it: not lost. Back without it: lost.
        lost.ended_with_worker("a", T, 0);
        assert_eq!(lost.rejoined("a", &[T]), []);
        lost.ended_with_worker("a", T, 0);
        assert_eq!(lost.rejoined("a", &[]), [T]);
        // Never back: lost once the wait is over, not before.
        lost.ended_with_worker("b", T, 100);
        assert_eq!(lost.next_deadline(), Some(100 + GONE_AFTER_MS));
        assert_eq!(lost.due(99 + GONE_AFTER_MS), []);
        assert_eq!(lost.due(100 + GONE_AFTER_MS), [T]);
        assert_eq!(lost.count(T), 1);
        assert_eq!(lost.count(T), 2);
        lost.reset(T);
        assert_eq!(lost.count(T), 1);
        lost.forget_job(1);
        assert_eq!(lost.count(T), 1);
    }
}
