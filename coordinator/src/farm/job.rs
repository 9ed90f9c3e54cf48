//! A job as the farm core tracks it: its spec, counters of committed
//! results and stitched frames, and how its tasks map to frames, tiles and
//! sample ranges.

use std::sync::Arc;

use tessera_protocol::job::{sample_range, JobSpec};
use tessera_protocol::messages::{JobState, JobStatus, TaskRef, TaskSpec};

use crate::scheduler::Millis;

/// A job as the coordinator tracks it in memory; rebuilt from the database
/// on start.
pub(crate) struct Job {
    pub spec: Arc<JobSpec>,
    /// Set once the job is done, failed or canceled.
    pub final_state: Option<JobState>,
    pub error: Option<String>,
    pub tasks_per_frame: u32,
    pub tasks_done: u32,
    /// Accepted results per frame position.
    pub done_per_frame: Vec<u32>,
    pub stitched: Vec<bool>,
    pub frames_done: u32,
    pub render_ms: u64,
    pub bytes_uploaded: u64,
    pub bytes_deduplicated: u64,
    /// Asset bytes served to workers for this job (this run).
    pub bytes_to_workers: u64,
    pub submitted_unix_ms: u64,
    pub finished_unix_ms: Option<u64>,
    pub paused: bool,
    /// When this coordinator run first leased one of its tasks, and how many
    /// were done then (for the ETA).
    pub started: Option<(Millis, u32)>,
    /// `submit --verify`: the checks of its results.
    pub verify: Option<super::verify::Checks>,
}

impl Job {
    pub fn new(
        spec: JobSpec,
        submitted_unix_ms: u64,
        bytes_uploaded: u64,
        bytes_deduplicated: u64,
    ) -> Job {
        let tasks_per_frame = spec.tiles.count() * spec.sample_ranges;
        let frames = spec.frames.len();
        let verify =
            (spec.verify_percent > 0).then(|| super::verify::Checks::new(spec.verify_percent));
        Job {
            spec: Arc::new(spec),
            final_state: None,
            error: None,
            tasks_per_frame,
            tasks_done: 0,
            done_per_frame: vec![0; frames],
            stitched: vec![false; frames],
            frames_done: 0,
            render_ms: 0,
            bytes_uploaded,
            bytes_deduplicated,
            bytes_to_workers: 0,
            submitted_unix_ms,
            finished_unix_ms: None,
            paused: false,
            started: None,
            verify,
        }
    }

    pub fn tasks_total(&self) -> u32 {
        self.tasks_per_frame * self.spec.frames.len() as u32
    }

    /// Frame, tile and sample range of task `index`.
    pub fn task_spec(&self, task: TaskRef) -> TaskSpec {
        let spec = &self.spec;
        let frame_pos = task.index / self.tasks_per_frame;
        let rest = task.index % self.tasks_per_frame;
        let (tile, range) = (rest / spec.sample_ranges, rest % spec.sample_ranges);
        let (w, h) = spec.resolution;
        TaskSpec {
            task,
            frame: spec.frames[frame_pos as usize],
            tile: spec.tiles.rect(tile, w, h),
            samples: sample_range(spec.samples, range, spec.sample_ranges),
            total_samples: spec.samples,
        }
    }

    pub fn status(&self, id: u64, running: u32, blocked: Option<String>) -> JobStatus {
        let state = match self.final_state {
            Some(s) => s,
            None if self.tasks_done > 0 || running > 0 => JobState::Running,
            None => JobState::Queued,
        };
        JobStatus {
            id,
            name: self.spec.name.clone(),
            engine: self.spec.engine,
            state,
            priority: self.spec.priority,
            frames_total: self.spec.frames.len() as u32,
            frames_done: self.frames_done,
            tasks_total: self.tasks_total(),
            tasks_done: self.tasks_done,
            tasks_running: running,
            bytes_uploaded: self.bytes_uploaded,
            bytes_deduplicated: self.bytes_deduplicated,
            bytes_to_workers: self.bytes_to_workers,
            render_ms: self.render_ms,
            submitted_unix_ms: self.submitted_unix_ms,
            finished_unix_ms: self.finished_unix_ms,
            error: self.error.clone(),
            blocked: if self.final_state.is_some() {
                None
            } else {
                blocked
            },
            cost_usd: 0.0,
            cost_to_finish_usd: None,
            eta_secs: None,
            paused: self.paused,
            verification: self.verify.as_ref().map(|v| v.summary()),
        }
    }
}
