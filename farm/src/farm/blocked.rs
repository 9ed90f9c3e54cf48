//! Why a job cannot progress now: the reason its status and the
//! `job.blocked` webhook give.

use tessera_protocol::job::Engine;

use super::FarmCore;
use crate::scheduler::WorkerId;

impl FarmCore {
    /// Why a job needing `engine` cannot progress now, if it cannot.
    pub(super) fn blocked(&self, job: u64, engine: Engine) -> Option<String> {
        // Every task accepted: stitching what is left needs no worker.
        if self
            .sched
            .job_progress(job)
            .is_some_and(|p| p.total > 0 && p.done == p.total)
        {
            return None;
        }
        if let Some(why) = self.jobs.get(&job).and_then(|j| j.budget_reached.clone()) {
            return Some(why);
        }
        // Paused, or waiting for the jobs it runs after: held, not blocked
        // (no `job.blocked` for it while the workers rejoin a restart).
        if self.jobs.get(&job).is_some_and(|j| j.held()) {
            return None;
        }
        if self.workers.is_empty() {
            return Some("no workers are connected".into());
        }
        let offering: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| w.info.engines.contains(&engine))
            .map(|(&id, _)| id)
            .collect();
        if offering.is_empty() {
            return Some(format!("no connected worker offers the {engine} engine"));
        }
        if let Some(reason) = (self.sched.blender_blocked(job)).or(self.sched.host_blocked(job)) {
            return Some(reason);
        }
        if let Some(reason) = self.check_blocked(job) {
            return Some(reason);
        }
        if offering.iter().all(|&w| self.sched.is_blocklisted(job, w)) {
            let last = self
                .sched
                .last_error(job)
                .map_or(String::new(), |e| format!("; last error: {e}"));
            return Some(format!("every connected worker offering the {engine} engine failed this job too often and is blocklisted for it{last}"));
        }
        self.only_ineligible(job, engine, &offering)
    }

    /// Why a job with tasks waiting gets none rendered when every worker
    /// that offers its engine is draining, quarantined or blocklisted for
    /// it (naming them, a few of each), if so.
    fn only_ineligible(&self, job: u64, engine: Engine, offering: &[WorkerId]) -> Option<String> {
        if self.sched.job_progress(job).is_none_or(|p| p.queued == 0) {
            return None;
        }
        let (mut draining, mut quarantined, mut blocklisted) = (vec![], vec![], vec![]);
        for &id in offering {
            let w = &self.workers[&id];
            if self.quarantined.contains_key(&w.identity) {
                quarantined.push(w.name.as_str());
            } else if w.draining {
                draining.push(w.name.as_str());
            } else if self.sched.is_blocklisted(job, id) {
                blocklisted.push(w.name.as_str());
            } else {
                return None;
            }
        }
        let named = |what: &str, names: &mut Vec<&str>| {
            names.sort_unstable();
            let more = names.len().saturating_sub(3);
            let mut list = names.iter().take(3).copied().collect::<Vec<_>>().join(", ");
            if more > 0 {
                list += &format!(" and {more} more");
            }
            (!names.is_empty()).then(|| format!("{what} ({list})"))
        };
        let why: Vec<String> = [
            named("draining", &mut draining),
            named("quarantined", &mut quarantined),
            named("blocklisted for this job", &mut blocklisted),
        ]
        .into_iter()
        .flatten()
        .collect();
        Some(format!(
            "every connected worker offering the {engine} engine is {}: none takes new work for this job",
            why.join(" or ")
        ))
    }
}
