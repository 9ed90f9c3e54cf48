//! Cache affinity: each job's assets (digest, size) and what each worker's
//! cache holds, so that a task goes to the free worker that lacks the fewest
//! of its job's bytes.

use super::*;

impl Scheduler {
    /// Turns cache affinity off (for comparisons); it is on by default.
    pub fn set_affinity(&mut self, on: bool) {
        self.affinity.off = !on;
    }

    /// The assets (digest, size) every task of `job` needs.
    pub fn set_job_assets(&mut self, job: JobId, assets: Vec<(Digest, u64)>) {
        self.affinity.assets.insert(job, assets);
    }

    /// What `worker`'s cache gained and lost.
    pub fn worker_holds(&mut self, worker: WorkerId, added: &[Digest], removed: &[Digest]) {
        let held = self.affinity.held.entry(worker).or_default();
        for d in removed {
            held.remove(d);
        }
        // What a worker claims to hold is bounded, however many times it
        // claims more.
        let room = MAX_CACHED_DIGESTS.saturating_sub(held.len());
        held.extend(added.iter().copied().take(room));
    }

    /// Whether `worker`'s cache holds every one of `digests`.
    pub fn worker_holds_all(&self, worker: WorkerId, digests: &[Digest]) -> bool {
        self.affinity
            .held
            .get(&worker)
            .is_some_and(|held| digests.iter().all(|d| held.contains(d)))
    }

    /// Among `worker` and the other free workers in `turns` that can take
    /// `job`, the one lacking the fewest of its bytes (`worker` on a tie).
    pub(super) fn affine_worker(
        &self,
        job: JobId,
        worker: WorkerId,
        turns: &VecDeque<WorkerId>,
        now: Millis,
    ) -> WorkerId {
        if self.affinity.off || !self.affinity.assets.contains_key(&job) {
            return worker;
        }
        let j = &self.jobs[&job];
        let eligible = |w: &WorkerId| {
            let wk = &self.workers[w];
            wk.has_room(self.ahead_of(wk))
                && !wk.is_silent(now, self.config.lease_ms)
                && wk.engines.contains(&j.engine)
                && self.fits(*w, job)
                && !j.blocklist.contains(w)
                && j.has_task_for(wk.tag)
        };
        let mut best = (self.affinity.missing(job, worker), worker);
        for &w in turns.iter().filter(|w| **w != worker && eligible(w)) {
            let missing = self.affinity.missing(job, w);
            if missing < best.0 {
                best = (missing, w);
            }
        }
        best.1
    }
}
