//! Host matching: a job with host needs (an OpenJD template's
//! `hostRequirements`) goes only to a worker whose machine meets them, and
//! when no connected worker's does, `status` says why (`needs at least 2
//! GPUs; has 1`). A worker that reported no machine (an older release)
//! meets no needs.

use tessera_protocol::host::{HostFacts, HostNeeds};

use super::{JobId, Scheduler, WorkerId};

impl Scheduler {
    /// What `job` needs of a machine (nothing, unless set).
    pub fn set_job_host(&mut self, job: JobId, needs: HostNeeds) {
        if !needs.is_empty() {
            self.host_needs.insert(job, needs);
        }
    }

    /// What `worker`'s machine has (`None`: it did not say).
    pub fn set_worker_host(&mut self, worker: WorkerId, facts: Option<HostFacts>) {
        match facts {
            Some(f) => self.host_facts.insert(worker, f),
            None => self.host_facts.remove(&worker),
        };
    }

    /// Whether `worker` may render `job`: one of its Blenders can, and its
    /// machine meets the job's host needs.
    pub(super) fn fits(&self, worker: WorkerId, job: JobId) -> bool {
        self.blender_fits(worker, job) && self.host_fits(worker, job)
    }

    fn host_fits(&self, worker: WorkerId, job: JobId) -> bool {
        let Some(needs) = self.host_needs.get(&job) else {
            return true;
        };
        (self.host_facts.get(&worker)).is_some_and(|f| needs.unmet(f).is_none())
    }

    /// Why no connected worker's machine meets `job`'s host needs, if none
    /// does: the first worker's shortfall.
    pub fn host_blocked(&self, job: JobId) -> Option<String> {
        let needs = self.host_needs.get(&job)?;
        let mut reason = None;
        for w in self.workers.keys() {
            match self.host_facts.get(w) {
                Some(f) => match needs.unmet(f) {
                    None => return None,
                    Some(why) => {
                        reason.get_or_insert(why);
                    }
                },
                None => {
                    reason.get_or_insert_with(|| {
                        "has host needs; a connected worker does not report its machine (upgrade it)"
                            .to_string()
                    });
                }
            }
        }
        reason
    }
}
