//! A job as the farm core tracks it: its spec, counters of committed
//! results and stitched frames, and how its tasks map to frames, tiles and
//! sample ranges.

use std::collections::BTreeSet;
use std::sync::Arc;

use tessera_protocol::job::{sample_range, JobSpec, ManifestEntry, TileRect};
use tessera_protocol::messages::{
    EncodeJob, JobInfo, JobState, JobStatus, StitchedPasses, TaskRef, TaskSpec,
};
use tessera_protocol::unreal::Chunk;

use crate::scheduler::Millis;

/// A job as the coordinator tracks it in memory; rebuilt from the database
/// on start.
pub(crate) struct Job {
    pub spec: Arc<JobSpec>,
    /// Set once the job is done, failed or canceled.
    pub final_state: Option<JobState>,
    pub error: Option<String>,
    pub tasks_per_frame: u32,
    /// For Unreal jobs: each task's chunk of frames (shot, first frame
    /// position, length); `None` for jobs whose tasks are one frame's.
    pub chunks: Option<Vec<Chunk>>,
    pub tasks_done: u32,
    /// Which tasks are counted in `tasks_done` (a bit each): a task is
    /// counted once, whatever the commits report.
    counted: Vec<u64>,
    /// Accepted results per frame position.
    pub done_per_frame: Vec<u32>,
    pub stitched: Vec<bool>,
    /// Per frame position, for a job whose frames end with a finishing
    /// task: its stitched passes, once stored (the finishing task's input).
    pub passes: Vec<Option<StitchedPasses>>,
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
    /// Of the jobs it runs after (`--after`), those still live.
    pub waiting: BTreeSet<u64>,
    /// Of the jobs it runs after, those that failed or were canceled.
    pub failed_deps: Vec<(u64, JobState)>,
    /// Resumed while held by a failed dependency: it runs without it.
    pub released: bool,
    /// Its budget was reached under `--on-budget stop-dispatch`: why no
    /// more tasks are handed out.
    pub budget_reached: Option<String>,
    /// For an encode job: its input frames as job files, once the
    /// coordinator has read them (the job is held until then).
    pub inputs: Option<Vec<ManifestEntry>>,
    /// For an encode job: its inputs were asked for this run.
    pub inputs_asked: bool,
}

impl Job {
    /// What a worker is told of the job (`id`) before its first task.
    pub fn info(&self, id: u64) -> JobInfo {
        let spec = &self.spec;
        JobInfo {
            job: id,
            engine: spec.engine,
            scene: spec.scene.clone(),
            manifest: (spec.manifest.iter())
                .chain(self.inputs.iter().flatten())
                .cloned()
                .collect(),
            resolution: spec.resolution,
            output: spec.output,
            blender: spec.blender,
            unreal: spec.unreal.clone(),
            finish: spec.finish,
            task_timeout_ms: spec.task_timeout_ms,
            render_format: spec.render_format,
            encode: spec.encode.clone().map(|spec| EncodeJob {
                spec: *spec,
                movie: self.spec.output_name.clone().unwrap_or_default(),
            }),
        }
    }

    pub fn new(
        spec: JobSpec,
        submitted_unix_ms: u64,
        bytes_uploaded: u64,
        bytes_deduplicated: u64,
    ) -> Job {
        let tasks_per_frame = spec.tasks_per_frame();
        let frames = spec.frames.len();
        let chunks = spec.unreal.as_ref().map(|u| u.chunks(&spec.frames));
        let verify =
            (spec.verify_percent > 0).then(|| super::verify::Checks::new(spec.verify_percent));
        let spec_paused = spec.paused;
        Job {
            spec: Arc::new(spec),
            final_state: None,
            error: None,
            tasks_per_frame,
            chunks,
            tasks_done: 0,
            counted: Vec::new(),
            done_per_frame: vec![0; frames],
            stitched: vec![false; frames],
            passes: vec![None; frames],
            frames_done: 0,
            render_ms: 0,
            bytes_uploaded,
            bytes_deduplicated,
            bytes_to_workers: 0,
            submitted_unix_ms,
            finished_unix_ms: None,
            paused: spec_paused,
            started: None,
            verify,
            waiting: BTreeSet::new(),
            failed_deps: Vec::new(),
            released: false,
            budget_reached: None,
            inputs: None,
            inputs_asked: false,
        }
    }

    /// Whether a failed or canceled dependency holds it (`--after-failure
    /// hold`, not resumed).
    pub fn held_by_failure(&self) -> bool {
        !self.failed_deps.is_empty() && !self.released
    }

    /// Whether it may hand out no task now: paused, waiting for a job it
    /// runs after, held by one that failed, or an encode job whose input
    /// frames are not known yet.
    pub fn held(&self) -> bool {
        self.paused
            || !self.waiting.is_empty()
            || self.held_by_failure()
            || (self.spec.encode.is_some() && self.inputs.is_none())
    }

    /// Why it waits for the jobs it runs after, if it does.
    pub fn dependency_reason(&self, id: u64) -> Option<String> {
        if let Some(&(dep, state)) = self.failed_deps.first().filter(|_| !self.released) {
            let what = if state == JobState::Canceled {
                "was canceled"
            } else {
                "failed"
            };
            return Some(format!(
                "held: job {dep}, which it runs after, {what}; `tessera resume {id}` runs it anyway, `tessera cancel {id}` drops it"
            ));
        }
        if self.waiting.is_empty() {
            return None;
        }
        let list: Vec<String> = self.waiting.iter().map(u64::to_string).collect();
        let jobs = if list.len() == 1 { "job" } else { "jobs" };
        Some(format!(
            "waiting for {jobs} {} to finish (--after)",
            list.join(", ")
        ))
    }

    /// The jobs it still waits for (see `JobStatus::waiting_for`).
    pub fn waiting_for(&self) -> Vec<u64> {
        let mut out: Vec<u64> = self.waiting.iter().copied().collect();
        if !self.released {
            out.extend(self.failed_deps.iter().map(|&(d, _)| d));
        }
        out.sort_unstable();
        out
    }

    pub fn tasks_total(&self) -> u32 {
        match &self.chunks {
            Some(chunks) => chunks.len() as u32,
            None => self.tasks_per_frame * self.spec.frames.len() as u32,
        }
    }

    /// The frame positions task `index` renders.
    pub fn frame_positions(&self, index: u32) -> std::ops::Range<usize> {
        match self.chunks.as_ref().and_then(|c| c.get(index as usize)) {
            Some(c) => c.first_pos as usize..(c.first_pos + c.len) as usize,
            None if self.chunks.is_some() => 0..0,
            None => {
                let pos = (index / self.tasks_per_frame) as usize;
                pos..pos + 1
            }
        }
    }

    /// Marks task `index` counted: false when it was already (or is not
    /// one of the job's tasks), and it must not be counted again.
    pub fn count_once(&mut self, index: u32) -> bool {
        if index >= self.tasks_total() {
            return false;
        }
        let (word, bit) = ((index / 64) as usize, 1u64 << (index % 64));
        if self.counted.len() <= word {
            self.counted.resize(word + 1, 0);
        }
        let fresh = self.counted[word] & bit == 0;
        self.counted[word] |= bit;
        fresh
    }

    /// Whether task `index` is counted.
    pub fn is_counted(&self, index: u32) -> bool {
        (self.counted.get((index / 64) as usize)).is_some_and(|w| w & (1u64 << (index % 64)) != 0)
    }

    /// Task `index` is no longer counted (its result was withdrawn).
    pub fn uncount(&mut self, index: u32) {
        if let Some(word) = self.counted.get_mut((index / 64) as usize) {
            *word &= !(1u64 << (index % 64));
        }
    }

    /// Whether every task of frame position `pos` is done.
    pub fn frame_complete(&self, pos: usize) -> bool {
        let need = if self.chunks.is_some() {
            1
        } else {
            self.tasks_per_frame
        };
        self.done_per_frame.get(pos) == Some(&need)
    }

    /// Tasks of a frame that render (all but its finishing task).
    pub fn renders_per_frame(&self) -> u32 {
        self.tasks_per_frame - u32::from(self.spec.finish)
    }

    /// Whether frame `pos` waits for a stitch: all its tasks are done
    /// (the frame), or all but its finishing task and its passes are not
    /// stored yet (the passes).
    pub fn stitch_due(&self, pos: usize) -> bool {
        let n = self.done_per_frame[pos];
        if self.stitched[pos] {
            return false;
        }
        self.frame_complete(pos)
            || (self.spec.finish && n == self.renders_per_frame() && self.passes[pos].is_none())
    }

    /// The finishing tasks of the job's frames, if it has them: each
    /// frame's last task.
    pub fn finishing_tasks(&self) -> Vec<u32> {
        if !self.spec.finish {
            return Vec::new();
        }
        let n = self.spec.frames.len() as u32;
        (1..=n).map(|k| k * self.tasks_per_frame - 1).collect()
    }

    /// Frame, tile and sample range of task `index`; a frame's finishing
    /// task covers the whole frame and names its stitched passes.
    pub fn task_spec(&self, task: TaskRef) -> TaskSpec {
        let spec = &self.spec;
        if let (Some(chunks), Some(unreal)) = (&self.chunks, &spec.unreal) {
            let (w, h) = spec.resolution;
            let chunk = chunks[task.index as usize];
            return TaskSpec {
                task,
                frame: spec.frames[chunk.first_pos as usize],
                tile: TileRect {
                    x: 0,
                    y: 0,
                    width: w,
                    height: h,
                },
                samples: (0, spec.samples),
                total_samples: spec.samples,
                unreal: Some(unreal.task(&spec.frames, chunk)),
                finish: None,
            };
        }
        let frame_pos = task.index / self.tasks_per_frame;
        let rest = task.index % self.tasks_per_frame;
        let (w, h) = spec.resolution;
        let frame = spec.frames[frame_pos as usize];
        if rest == self.renders_per_frame() {
            return TaskSpec {
                task,
                frame,
                tile: TileRect {
                    x: 0,
                    y: 0,
                    width: w,
                    height: h,
                },
                samples: (0, spec.samples),
                total_samples: spec.samples,
                finish: self.passes[frame_pos as usize],
                unreal: None,
            };
        }
        let (tile, range) = (rest / spec.sample_ranges, rest % spec.sample_ranges);
        TaskSpec {
            task,
            frame,
            tile: spec.tiles.rect(tile, w, h),
            samples: sample_range(spec.samples, range, spec.sample_ranges),
            total_samples: spec.samples,
            unreal: None,
            finish: None,
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
                self.dependency_reason(id).or(blocked)
            },
            cost_usd: 0.0,
            cost_to_finish_usd: None,
            eta_secs: None,
            paused: self.paused,
            verification: self.verify.as_ref().map(|v| v.summary()),
            after: self.spec.after.clone(),
            after_failure: self.spec.after_failure,
            waiting_for: if self.final_state.is_some() {
                Vec::new()
            } else {
                self.waiting_for()
            },
            deadline_unix_ms: self.spec.deadline_unix_ms,
            budget_usd: self.spec.budget.map(|b| b.usd),
        }
    }
}
