//! Encode jobs (ffmpeg over the frames of the job they run after): such a
//! job is held until the job it encodes has ended and the coordinator has
//! read that job's frames from the database ([`Effect::ResolveInputs`]);
//! they then become the job's input files, sent to the worker with its
//! manifest and readable by it while it holds the task.

use tessera_protocol::job::ManifestEntry;

use super::{Effect, FarmCore, Now};

impl FarmCore {
    /// Asks for an encode job's input frames once nothing else holds it
    /// back from them (the job it encodes has ended), once per run.
    pub(super) fn ask_inputs(&mut self, id: u64) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let Some(input) = job.spec.encode.as_ref().map(|e| e.input) else {
            return;
        };
        // A job just submitted is not linked to those it runs after yet
        // (its `waiting` is still empty): the input's own state decides.
        let input_live = (self.jobs.get(&input)).is_some_and(|j| j.final_state.is_none());
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        if input_live
            || job.inputs.is_some()
            || job.inputs_asked
            || !job.waiting.is_empty()
            || job.held_by_failure()
        {
            return;
        }
        job.inputs_asked = true;
        self.effects.push(Effect::ResolveInputs { job: id, input });
    }

    /// The coordinator read an encode job's input frames (as job files),
    /// or why it could not: the job runs, or fails with that reason.
    pub fn inputs_resolved(
        &mut self,
        id: u64,
        inputs: Result<Vec<ManifestEntry>, String>,
        now: Now,
    ) {
        match inputs {
            Ok(files) => {
                let Some(job) = self.jobs.get_mut(&id).filter(|j| j.final_state.is_none()) else {
                    return;
                };
                job.inputs = Some(files);
                self.apply_holds(id, now);
            }
            Err(e) => self.fail_job(id, e, now),
        }
    }
}
