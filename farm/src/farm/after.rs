//! Job dependencies and holds (`submit --after`, `--after-failure`,
//! `--paused`): a job hands out no task while it is paused or while a job
//! it runs after is live; when one of those fails or is canceled, it fails
//! too or stays held, as its spec says. A job can only run after jobs that
//! already exist, so dependencies never form a cycle.
//!
//! The scheduler knows only "paused or not": this module keeps its flag
//! equal to [`Job::held`](super::Job::held) after every change.

use tessera_protocol::job::AfterFailure;
use tessera_protocol::messages::JobState;

use super::{Effect, FarmCore, Now, FINISHED_KEPT};

impl FarmCore {
    /// Links a job just submitted or restored to the jobs it runs after:
    /// those live in the core are waited for; `stored` gives the final
    /// states the database holds for the others (a job this run finished
    /// recently is known to the core even before the database records it).
    /// A dependency nobody knows counts as failed.
    pub fn link_after(&mut self, id: u64, stored: &[(u64, JobState)], now: Now) {
        let Some(job) = self.jobs.get(&id).filter(|j| j.final_state.is_none()) else {
            return;
        };
        let after = job.spec.after.clone();
        let (mut waiting, mut failed) = (Vec::new(), Vec::new());
        for dep in after {
            if dep != id && self.jobs.get(&dep).is_some_and(|j| j.final_state.is_none()) {
                waiting.push(dep);
                continue;
            }
            let state = (self.finished.get(&dep).copied())
                .or_else(|| stored.iter().find(|(j, _)| *j == dep).map(|&(_, s)| s))
                .filter(|s| s.is_final())
                .unwrap_or(JobState::Failed);
            if state != JobState::Done {
                failed.push((dep, state));
            }
        }
        if let Some(job) = self.jobs.get_mut(&id) {
            job.waiting = waiting.into_iter().collect();
            job.failed_deps = failed;
        }
        self.apply_holds(id, now);
    }

    /// Puts back what a restarted coordinator recorded of a job's holds.
    pub fn restore_holds(&mut self, id: u64, paused: bool, released: bool) {
        if let Some(job) = self.jobs.get_mut(&id) {
            job.paused = paused;
            job.released = released;
        }
    }

    /// Fails a job a failed dependency fails (`--after-failure fail`), or
    /// makes the scheduler's pause flag follow the job's holds.
    pub(super) fn apply_holds(&mut self, id: u64, now: Now) {
        let Some(job) = self.jobs.get(&id).filter(|j| j.final_state.is_none()) else {
            return;
        };
        if job.held_by_failure() && job.spec.after_failure == AfterFailure::Fail {
            let (dep, state) = job.failed_deps[0];
            let what = if state == JobState::Canceled {
                "was canceled"
            } else {
                "failed"
            };
            let error = format!(
                "job {dep}, which this job runs after, {what} (submit with --after-failure hold to keep such a job waiting instead)"
            );
            self.fail_job(id, error, now);
            return;
        }
        self.ask_inputs(id);
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let held = job.held();
        self.sched.pause_job(id, held);
        self.cancel_handed_back("the job is paused or held");
        if !held {
            self.effects.push(Effect::Wake);
        }
    }

    /// A job ended: remember its state for a while, and tell the jobs that
    /// run after it, and theirs in turn (in a loop: a chain may be long).
    pub(super) fn job_ended(&mut self, id: u64, state: JobState, now: Now) {
        self.finished.insert(id, state);
        while self.finished.len() > FINISHED_KEPT {
            self.finished.pop_first();
        }
        self.settle.push((id, state));
        if self.settling {
            return;
        }
        self.settling = true;
        while let Some((ended, state)) = self.settle.pop() {
            let dependents: Vec<u64> = (self.jobs.iter())
                .filter(|(_, j)| j.waiting.contains(&ended))
                .map(|(&d, _)| d)
                .collect();
            for d in dependents {
                if let Some(job) = self.jobs.get_mut(&d) {
                    job.waiting.remove(&ended);
                    if state != JobState::Done {
                        job.failed_deps.push((ended, state));
                    }
                    let ready = !job.held();
                    if ready {
                        tracing::info!(job = d, after = ended, "the jobs it runs after are done");
                    }
                }
                self.apply_holds(d, now);
            }
        }
        self.settling = false;
    }
}
