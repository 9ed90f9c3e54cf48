//! The farm core's job events: results committed, frames stitched, jobs
//! done, failed, canceled, paused and resumed, workers drained.

use tessera_protocol::job::{JobSpec, OutputFormat};
use tessera_protocol::messages::{CoordMsg, FarmEvent, JobState, JobStatus, StitchedPasses};

use super::{key, AcceptedResult, CommitFailure, Effect, FarmCore, Now};
use crate::farm::FinalCounts;
use crate::scheduler::WorkerId;

/// What the stitcher makes of a frame's results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StitchStage {
    /// The frame, from its tiles and sample ranges.
    Frame,
    /// A frame with a finishing task: its passes, from its tiles and
    /// sample ranges, as the finishing task's input (not a frame).
    Passes,
    /// A frame with a finishing task: its finishing task's output.
    Finished,
}

/// A stitch to do: the job's spec, the frame's first task, how many of its
/// tasks render, and what to make.
pub struct StitchPlan {
    pub spec: std::sync::Arc<JobSpec>,
    pub first: u32,
    pub renders: u32,
    pub stage: StitchStage,
    /// A frame with a finishing task: its stitched passes, once stored.
    pub passes: Option<StitchedPasses>,
}

impl FarmCore {
    /// The cost of each job's closed leases, stored with its results.
    pub fn closed_costs(&self, jobs: &[u64]) -> Vec<(u64, f64)> {
        let mut jobs = jobs.to_vec();
        jobs.sort_unstable();
        jobs.dedup();
        (jobs.into_iter())
            .map(|j| (j, self.ledger.closed_cost(j)))
            .collect()
    }

    /// The database has written `batch` (`Ok(fresh)`: which rows were new)
    /// or failed to: acknowledges each result, counts it and asks for the
    /// frames it completes.
    ///
    /// A row the database already held for an accepted result was, as a
    /// rule, written by a commit this core was told had failed: its answer
    /// was lost (a connection that closed at its commit) and the database
    /// then stayed out of reach past the commit's patience, so the batch
    /// was refused and the task ran again. That row is the task's result of
    /// record (stitches read it) and is counted now; left uncounted, its
    /// frame would never be stitched and the job never end. A task is
    /// counted once whatever the commits report (`Job::count_once`): a
    /// job retried while one of its commits was in flight sees that task's
    /// row land, and then the same task's result again. In a job whose
    /// results are checked, such a row may be one nobody checked, so the
    /// job fails saying so rather than take it.
    pub fn committed(
        &mut self,
        batch: &[AcceptedResult],
        outcome: Result<Vec<bool>, CommitFailure>,
        now: Now,
    ) {
        // A result may leave a checked job waiting for another identity.
        self.check_blocked_soon();
        // Tasks whose results an outage refused are handed out again only
        // after a wait that grows while the outage lasts: not rendered
        // again and again at once (rented time) while nothing can be kept.
        let hold = match &outcome {
            Err(e) if e.transient => {
                self.refused_in_a_row = self.refused_in_a_row.saturating_add(1);
                let doublings = (self.refused_in_a_row - 1).min(6);
                (super::OUTAGE_HOLD_MS << doublings).min(super::OUTAGE_HOLD_MAX_MS)
            }
            _ => {
                self.refused_in_a_row = 0;
                0
            }
        };
        let mut failed_jobs = Vec::new();
        for (i, c) in batch.iter().enumerate() {
            let (accepted, reason) = match &outcome {
                Ok(fresh) if !fresh.get(i).copied().unwrap_or(false) && self.checked(c) => {
                    // The row held may be an identity's result that was
                    // never checked (or a liar's whose withdrawal failed):
                    // not taken for the job's pixels.
                    let error = format!(
                        "task {}: the database holds a result for it that was not checked \
                         (a commit whose answer was lost, or a withdrawal that failed); \
                         submit the job again",
                        c.task.index
                    );
                    failed_jobs.push((c.task.job, error));
                    (true, None)
                }
                Ok(fresh) => {
                    if !fresh.get(i).copied().unwrap_or(false) {
                        tracing::warn!(
                            job = c.task.job,
                            task = c.task.index,
                            "the database already held this task's result, from a commit \
                             whose answer was lost: it is the result of record"
                        );
                    }
                    if self.still_counts(c.task) {
                        self.count_result(c, now);
                    }
                    (true, None)
                }
                Err(e) if e.transient => {
                    // Rendered again later (by this coordinator once the
                    // database is back, or by the one that took over).
                    self.sched
                        .reopen_at(key(c.task), now.ms.saturating_add(hold));
                    (false, Some(e.reason.clone()))
                }
                Err(e) => {
                    let error = format!("the coordinator could not store a result: {}", e.reason);
                    failed_jobs.push((c.task.job, error));
                    (false, Some(e.reason.clone()))
                }
            };
            if let Some(w) = self.workers.get_mut(&c.worker) {
                w.tasks_done += u64::from(accepted);
            }
            let ack = CoordMsg::Ack {
                task: c.task,
                accepted,
                reason,
            };
            self.send(c.worker, ack);
        }
        for (job, error) in failed_jobs {
            self.fail_job(job, error, now);
        }
        self.effects.push(Effect::Wake);
    }

    /// Whether the job of `c` has its results checked (`--verify`).
    fn checked(&self, c: &AcceptedResult) -> bool {
        (self.jobs.get(&c.task.job)).is_some_and(|j| j.verify.is_some())
    }

    fn count_result(&mut self, c: &AcceptedResult, now: Now) {
        let job = self.jobs.get_mut(&c.task.job);
        if job.is_some_and(|job| !job.count_once(c.task.index)) {
            // Counted already: a result of this task committed while the
            // job was being retried (restored without it), say.
            tracing::warn!(
                job = c.task.job,
                task = c.task.index,
                "a result for a task already counted: not counted again"
            );
            return;
        }
        let event = FarmEvent::TaskFinished {
            job: c.task.job,
            index: c.task.index,
            worker: c.worker,
            render_ms: c.render_ms,
        };
        self.emit(now, event);
        if let Some(job) = self.jobs.get_mut(&c.task.job) {
            let positions = job.frame_positions(c.task.index);
            if positions.is_empty() || positions.end > job.done_per_frame.len() {
                return;
            }
            job.tasks_done += 1;
            job.render_ms += c.render_ms;
            for pos in positions {
                job.done_per_frame[pos] += 1;
                if job.stitch_due(pos) {
                    self.effects.push(Effect::Stitch {
                        job: c.task.job,
                        frame_pos: pos,
                    });
                }
            }
        }
    }

    /// What a stitch of `frame_pos` needs, or `None` when there is nothing
    /// to stitch any more.
    pub fn stitch_plan(&self, job: u64, frame_pos: usize) -> Option<StitchPlan> {
        let job = self.jobs.get(&job)?;
        if frame_pos >= job.stitched.len() || !job.stitch_due(frame_pos) {
            return None;
        }
        if job.final_state.is_some() {
            return None;
        }
        let first = frame_pos as u32 * job.tasks_per_frame;
        let passes = job.spec.finish && job.done_per_frame[frame_pos] == job.renders_per_frame();
        Some(StitchPlan {
            spec: job.spec.clone(),
            first,
            renders: job.renders_per_frame(),
            stage: match (job.spec.finish, passes) {
                (false, _) => StitchStage::Frame,
                (true, true) => StitchStage::Passes,
                (true, false) => StitchStage::Finished,
            },
            passes: job.passes.get(frame_pos).copied().flatten(),
        })
    }

    /// A frame's passes are stitched and stored: its finishing task is
    /// handed out now.
    pub fn passes_stitched(&mut self, job_id: u64, frame_pos: usize, passes: StitchedPasses) {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        let Some(slot) = job.passes.get_mut(frame_pos) else {
            return;
        };
        *slot = Some(passes);
        let index = (frame_pos as u32 + 1) * job.tasks_per_frame - 1;
        self.sched
            .release_held(crate::scheduler::TaskKey { job: job_id, index });
        self.effects.push(Effect::Wake);
    }

    /// The chunk task of an Unreal job that renders frame position `pos`.
    pub fn chunk_task(&self, job: u64, pos: usize) -> Option<u32> {
        let chunks = self.jobs.get(&job)?.chunks.as_ref()?;
        let i = chunks.partition_point(|c| c.first_pos as usize <= pos);
        let c = chunks.get(i.checked_sub(1)?)?;
        (pos < (c.first_pos + c.len) as usize).then_some(i as u32 - 1)
    }

    /// A frame is stitched and stored; the job is done with its last one.
    pub fn frame_stitched(&mut self, job_id: u64, frame_pos: usize, now: Now) {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        // A frame whose results were withdrawn while it was stitched waits
        // for them to be rendered again.
        let complete = job.done_per_frame.get(frame_pos) == Some(&job.tasks_per_frame);
        if complete && job.stitched.get(frame_pos) == Some(&false) {
            job.stitched[frame_pos] = true;
            job.frames_done += 1;
        }
        let done = job.frames_done == job.spec.frames.len() as u32 && job.final_state.is_none();
        if done {
            self.finish_job(job_id, JobState::Done, None, now);
            tracing::info!(job = job_id, "job done");
        }
    }

    /// Fails a job for good (a task failed too often, a result or frame
    /// could not be stored).
    pub fn fail_job(&mut self, job: u64, error: String, now: Now) {
        if self.jobs.get(&job).is_none_or(|j| j.final_state.is_some()) {
            return;
        }
        // Errors carry workers' words: cut to a stated size before they
        // are stored, shown and sent in every status reply.
        let error = tessera_protocol::text::truncate(&error, tessera_protocol::text::MAX_ERROR);
        tracing::error!(job, "job failed: {error}");
        self.finish_job(job, JobState::Failed, Some(error), now);
    }

    /// Cancels a running or queued job and returns its final status.
    /// `None` when the core does not hold it: no such job, or one that
    /// finished already (the database has those).
    pub fn cancel(&mut self, id: u64, now: Now) -> Option<JobStatus> {
        let status = self.finish_job(id, JobState::Canceled, None, now);
        if status.is_some() {
            tracing::info!(job = id, "job canceled");
        }
        status
    }

    /// Marks a job final, tells workers to drop its leases, asks for the
    /// state to be recorded with the job's cost and counters, and forgets
    /// the job: memory follows active work, the database keeps the rest.
    /// Returns its final status.
    pub(super) fn finish_job(
        &mut self,
        id: u64,
        state: JobState,
        error: Option<String>,
        now: Now,
    ) -> Option<JobStatus> {
        if self.jobs.get(&id).is_none_or(|j| j.final_state.is_some()) {
            return None;
        }
        self.lost.forget_job(id);
        if state != JobState::Done {
            let leases = self.sched.cancel_job(id);
            self.send_cancels(&leases, now);
        }
        self.emit(now, FarmEvent::JobChanged { job: id, state });
        let job = self.jobs.get_mut(&id)?;
        job.final_state = Some(state);
        job.error = error.clone();
        job.finished_unix_ms = Some(now.unix_ms);
        let counts = FinalCounts {
            tasks_done: job.tasks_done,
            frames_done: job.frames_done,
            render_ms: job.render_ms,
            bytes_to_workers: job.bytes_to_workers,
        };
        let status = self.job_status(id, now);
        if let Some(status) = &status {
            let status = Box::new(status.clone());
            self.effects.push(Effect::Ended { status });
        }
        let cost_usd = self.ledger.job_cost(id, now.ms);
        let job = self.jobs.get(&id)?;
        self.effects.push(Effect::Record {
            job: id,
            state,
            unix_ms: now.unix_ms,
            error,
            cost_usd,
            counts,
            verification: job.verify.as_ref().map(|v| v.summary()),
        });
        self.jobs.remove(&id);
        for w in self.workers.values_mut() {
            w.jobs_sent.remove(&id);
        }
        self.sched.forget_job(id);
        self.ledger.forget_job(id);
        self.released.retain(|t, _| t.job != id);
        self.earlier.retain(|t, _| t.job != id);
        self.blocklists.remove(&id);
        self.job_ended(id, state, now);
        status
    }

    /// Pauses or resumes a job; false when it is not queued or running.
    /// Resuming a job held because a job it runs after failed lets it run
    /// without that job; it never starts a job before a dependency that is
    /// still queued or running.
    pub fn pause(&mut self, job: u64, paused: bool, now: Now) -> bool {
        let Some(j) = self.jobs.get_mut(&job).filter(|j| j.final_state.is_none()) else {
            return false;
        };
        j.paused = paused;
        if !paused && !j.failed_deps.is_empty() {
            j.released = true;
        }
        let released = j.released;
        tracing::info!(job, paused, "job paused or resumed");
        self.emit(now, FarmEvent::JobHeld { job, paused });
        self.effects.push(Effect::Holds {
            job,
            paused,
            released,
        });
        self.apply_holds(job, now);
        true
    }

    /// Gives a queued or running job a new priority (higher goes first);
    /// false when it is not queued or running.
    pub fn set_priority(&mut self, job: u64, priority: i32) -> bool {
        let Some(j) = self.jobs.get_mut(&job).filter(|j| j.final_state.is_none()) else {
            return false;
        };
        if !self.sched.set_priority(job, priority) {
            return false;
        }
        std::sync::Arc::make_mut(&mut j.spec).priority = priority;
        tracing::info!(job, priority, "job priority changed");
        self.effects.push(Effect::Priority { job, priority });
        self.effects.push(Effect::Wake);
        true
    }

    /// Asks a worker to finish what it runs and leave; false when no such
    /// worker is connected.
    pub fn drain(&mut self, worker: WorkerId) -> bool {
        self.check_blocked_soon();
        self.sched.drain_worker(worker);
        let Some(w) = self.workers.get_mut(&worker) else {
            return false;
        };
        w.draining = true;
        tracing::info!(worker, "worker asked to drain");
        self.send(worker, CoordMsg::Drain);
        self.cancel_handed_back("the worker drains");
        true
    }

    /// Counts asset bytes served to a worker for a job.
    pub fn served_to_worker(&mut self, job: u64, bytes: u64) {
        if let Some(j) = self.jobs.get_mut(&job) {
            j.bytes_to_workers += bytes;
        }
    }

    /// An active job's spec (a finished job's is in the database).
    pub fn spec(&self, job: u64) -> Option<std::sync::Arc<JobSpec>> {
        self.jobs.get(&job).map(|j| j.spec.clone())
    }

    /// The output format of a job's frames.
    pub fn output_format(&self, job: u64) -> Option<OutputFormat> {
        self.jobs.get(&job).map(|j| j.spec.output)
    }
}
