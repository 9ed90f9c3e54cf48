//! What the coordinator reports about jobs, workers and the farm: the
//! parts of [`super::ClientResponse`]s.

use serde::{Deserialize, Serialize};

use super::MAX_TASK_LOG;
use crate::blender::BlenderOffer;
use crate::job::{Engine, OutputFormat, TileRect};
use crate::telemetry::Telemetry;
use crate::Digest;

/// Lowercase in JSON, as `name` (bincode encodes the variant's index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Queued,
    Running,
    Done,
    Failed,
    Canceled,
}

impl JobState {
    pub fn name(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
            JobState::Canceled => "canceled",
        }
    }

    /// The states a filter word names (`tessera status --state`, HTTP
    /// `?state=`): a state, `cancelled`, `active` (queued and running) or
    /// `finished` (done, failed and canceled); case-insensitive.
    pub fn named(word: &str) -> Option<Vec<JobState>> {
        use JobState::*;
        Some(match word.trim().to_ascii_lowercase().as_str() {
            "queued" => vec![Queued],
            "running" => vec![Running],
            "done" => vec![Done],
            "failed" => vec![Failed],
            "canceled" | "cancelled" => vec![Canceled],
            "active" => vec![Queued, Running],
            "finished" => vec![Done, Failed, Canceled],
            _ => return None,
        })
    }

    pub fn is_final(self) -> bool {
        matches!(self, JobState::Done | JobState::Failed | JobState::Canceled)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobStatus {
    pub id: u64,
    pub name: String,
    pub engine: Engine,
    pub state: JobState,
    pub priority: i32,
    pub frames_total: u32,
    pub frames_done: u32,
    pub tasks_total: u32,
    pub tasks_done: u32,
    pub tasks_running: u32,
    pub bytes_uploaded: u64,
    pub bytes_deduplicated: u64,
    /// Asset bytes the coordinator sent to workers for this job (since the
    /// coordinator started).
    pub bytes_to_workers: u64,
    /// Σ render time of accepted results, milliseconds.
    pub render_ms: u64,
    pub submitted_unix_ms: u64,
    pub finished_unix_ms: Option<u64>,
    pub error: Option<String>,
    /// Why a job that is not final cannot progress (e.g. no connected worker
    /// offers its engine).
    pub blocked: Option<String>,
    /// Σ over every lease its tasks held (finished or not) of lease time ×
    /// that worker's price per hour.
    pub cost_usd: f64,
    /// Remaining tasks at the observed cost per finished task.
    pub cost_to_finish_usd: Option<f64>,
    /// Remaining tasks at the observed rate, seconds.
    pub eta_secs: Option<f64>,
    pub paused: bool,
    /// `submit --verify`: what the checks found so far; `None` without.
    pub verification: Option<Verification>,
    /// `submit --after`: the jobs it runs after.
    pub after: Vec<u64>,
    /// What it does when one of those fails or is canceled.
    pub after_failure: crate::job::AfterFailure,
    /// Of `after`, the jobs it still waits for: not done yet, or failed
    /// while it is held (`--after-failure hold`, not resumed). Empty once
    /// it may run, and for a finished job.
    pub waiting_for: Vec<u64>,
    /// `submit --deadline`: when the job should be done (unix ms).
    #[serde(default)]
    pub deadline_unix_ms: Option<u64>,
    /// `submit --budget-usd`: the job's budget, USD.
    #[serde(default)]
    pub budget_usd: Option<f64>,
}

/// What a job's result checks (`submit --verify P`) found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Verification {
    pub percent: u32,
    /// Tasks whose check settled: two renders on workers of different
    /// identities agreed (after a third opinion when the first two did not).
    pub agreed: u32,
    /// Checks where two renders differed.
    pub mismatched: u32,
    /// Checks still waiting for another render.
    pub pending: u32,
    /// Results withdrawn and rendered again because their worker was
    /// caught returning wrong pixels.
    pub rerendered: u32,
    /// Workers quarantined by this job's checks (their names).
    pub quarantined: Vec<String>,
    /// Checks where three renders all differed: no worker could be blamed.
    pub inconclusive: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerStatus {
    pub id: u64,
    pub name: String,
    pub hostname: String,
    pub engines: Vec<Engine>,
    pub slots: u32,
    pub state: WorkerState,
    pub running: u32,
    pub tasks_done: u64,
    pub price_per_hour: f64,
    pub connected_secs: u64,
    /// The tasks it holds leases on.
    pub tasks: Vec<RunningTask>,
    pub telemetry: Option<Telemetry>,
    pub interruptible: bool,
    /// The Blenders it offers, each with the device its slots render on.
    pub blenders: Vec<BlenderOffer>,
}

/// One connected worker in detail (the HTTP API's `GET
/// /v1/workers/{worker}`, the dashboard's worker page).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerDetail {
    pub status: WorkerStatus,
    /// Jobs that give it no more tasks: it failed too many of theirs.
    pub blocklisted_by: Vec<u64>,
    /// Why it gets no work at all, when a failed `--verify` check
    /// quarantined its identity.
    pub quarantined: Option<String>,
    /// Its latest telemetry readings, oldest first (at most
    /// [`MAX_TELEMETRY_HISTORY`], one each time it reports telemetry:
    /// about every 5 s).
    pub history: Vec<TelemetryPoint>,
}

/// The most telemetry readings kept per connected worker.
pub const MAX_TELEMETRY_HISTORY: usize = 120;

/// One telemetry reading, reduced to what a sparkline draws.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TelemetryPoint {
    pub unix_ms: u64,
    /// The first GPU's utilisation and memory in use, when it reports them.
    pub gpu_utilization_pct: Option<u32>,
    pub gpu_memory_used_bytes: Option<u64>,
    pub load_1m: f32,
}

impl TelemetryPoint {
    pub fn of(unix_ms: u64, t: &Telemetry) -> TelemetryPoint {
        let gpu = t.gpus.first();
        TelemetryPoint {
            unix_ms,
            gpu_utilization_pct: gpu.map(|g| g.utilization_pct),
            gpu_memory_used_bytes: gpu.map(|g| g.memory_used_bytes),
            load_1m: t.host.load_1m,
        }
    }
}

/// What a `tessera fleet run` reports to the coordinator at each tick (and
/// writes to its status file): the nodes it rents and what they are
/// billed. The dashboard's farm page shows the latest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetReport {
    pub nodes: Vec<FleetNode>,
    /// Nodes replaced after they were lost.
    pub replaced: u32,
    /// What the providers billed since the fleet started, released nodes
    /// included.
    pub billed_usd: f64,
    /// The part of it the jobs' leases were billed; the rest is overhead
    /// (boot, idle, lost work).
    pub attributed_to_jobs_usd: f64,
    pub farm_overhead_usd: f64,
    pub billed_gpu_hours: f64,
    pub rendered_gpu_hours: f64,
}

/// One rented node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetNode {
    /// The fleet's name for it, also its worker's.
    pub name: String,
    /// The provider's id for it.
    pub node: String,
    pub gpu: String,
    pub usd_per_hour: f64,
    /// booting, joined, draining…
    pub state: String,
    /// Seconds since it was launched, and what that is billed.
    pub secs: f64,
    pub usd: f64,
}

/// The most nodes a fleet report may name (a fleet file's `max_nodes`
/// bound), and the longest string in it.
pub const MAX_FLEET_NODES: usize = 1000;
pub const MAX_FLEET_TEXT: usize = 256;

impl FleetReport {
    /// Makes the report's names fit [`FleetReport::check`]: control
    /// characters replaced, each cut (at a character) to
    /// [`MAX_FLEET_TEXT`] bytes. What a fleet does before it reports.
    pub fn fit(&mut self) {
        let fit = |t: &mut String| {
            let mut clean: String = t
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .collect();
            let mut end = clean.len().min(MAX_FLEET_TEXT);
            while !clean.is_char_boundary(end) {
                end -= 1;
            }
            clean.truncate(end);
            *t = clean;
        };
        for n in &mut self.nodes {
            for t in [&mut n.name, &mut n.node, &mut n.gpu, &mut n.state] {
                fit(t);
            }
        }
    }

    /// Why a report from the network cannot be kept, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.nodes.len() > MAX_FLEET_NODES {
            return Err(format!(
                "a fleet report names {} nodes: at most {MAX_FLEET_NODES}",
                self.nodes.len()
            ));
        }
        let numbers = [
            self.billed_usd,
            self.attributed_to_jobs_usd,
            self.farm_overhead_usd,
            self.billed_gpu_hours,
            self.rendered_gpu_hours,
        ];
        let node_numbers = self
            .nodes
            .iter()
            .flat_map(|n| [n.usd_per_hour, n.secs, n.usd]);
        if !numbers
            .into_iter()
            .chain(node_numbers)
            .all(|v| v.is_finite() && v >= 0.0)
        {
            return Err("a fleet report's figures must be finite and not negative".into());
        }
        let texts = self
            .nodes
            .iter()
            .flat_map(|n| [&n.name, &n.node, &n.gpu, &n.state]);
        if texts.into_iter().any(|t| t.len() > MAX_FLEET_TEXT) {
            return Err(format!(
                "a fleet report's names are at most {MAX_FLEET_TEXT} bytes"
            ));
        }
        Ok(())
    }
}

/// Lowercase in JSON, as `name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerState {
    Idle,
    Busy,
    /// Finishing its tasks, then leaving; takes no new work.
    Draining,
    /// Not heard from for a whole lease.
    Silent,
}

impl WorkerState {
    pub fn name(self) -> &'static str {
        match self {
            WorkerState::Idle => "idle",
            WorkerState::Busy => "busy",
            WorkerState::Draining => "draining",
            WorkerState::Silent => "silent",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunningTask {
    pub job: u64,
    pub index: u32,
    pub frame: u32,
    pub tile: TileRect,
    /// Samples done / total, as last reported by the engine.
    pub progress: Option<(u32, u32)>,
    /// What it is doing before rendering, as last reported (at most
    /// [`MAX_STAGE`] bytes): "compiling shaders: 1200 left".
    pub stage: Option<String>,
}

/// The longest task stage the coordinator keeps from a worker.
pub const MAX_STAGE: usize = 120;

/// Farm-wide figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FarmStatus {
    /// Σ price per hour of every connected worker.
    pub burn_usd_per_hour: f64,
    /// Σ price per hour of connected workers with nothing to do.
    pub idle_usd_per_hour: f64,
}

/// A tile of one frame, for the monitor's mosaic.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TileStatus {
    pub tile: TileRect,
    pub state: TileState,
}

/// Lowercase in JSON: `"done"`, or `{"rendering": [done, total]}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TileState {
    Queued,
    /// Samples done / total when reported.
    Rendering(Option<(u32, u32)>),
    Done,
    /// An attempt failed; it is queued for a retry (or the job failed).
    Failed,
}

/// Something that happened on the farm.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FarmEvent {
    WorkerJoined {
        worker: u64,
        name: String,
    },
    WorkerLeft {
        worker: u64,
        name: String,
    },
    TaskStarted {
        job: u64,
        index: u32,
        worker: u64,
    },
    TaskFinished {
        job: u64,
        index: u32,
        worker: u64,
        render_ms: u64,
    },
    TaskFailed {
        job: u64,
        index: u32,
        worker: u64,
        error: String,
    },
    JobChanged {
        job: u64,
        state: JobState,
    },
    /// A live job was paused (`paused`) or resumed. Version 18 peers
    /// (bincode, strict) do not know it and are not sent it.
    JobHeld {
        job: u64,
        paused: bool,
    },
}

impl FarmEvent {
    /// Whether a peer at version 18 knows this event.
    pub fn known_to_version_18(&self) -> bool {
        !matches!(self, FarmEvent::JobHeld { .. })
    }
}

/// A whole picture of the farm.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    pub unix_ms: u64,
    pub jobs: Vec<JobStatus>,
    pub workers: Vec<WorkerStatus>,
    pub farm: FarmStatus,
}

/// One failed attempt of a task, as `tessera logs` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskLog {
    pub task: u32,
    pub worker: u64,
    pub unix_ms: u64,
    pub error: String,
    pub log: String,
}

/// The last `MAX_TASK_LOG` bytes of `log`, cut at a character boundary.
pub fn log_tail(log: &str) -> &str {
    let mut start = log.len().saturating_sub(MAX_TASK_LOG);
    while !log.is_char_boundary(start) {
        start += 1;
    }
    &log[start..]
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FrameOutput {
    pub frame: u32,
    pub digest: Digest,
    pub size: u64,
    pub format: OutputFormat,
    /// The file name the scene gives this frame, when it names its frames.
    pub name: Option<String>,
}

impl FrameOutput {
    /// The file a frame is saved as: the scene's own name for it when that
    /// is a plain file name (no folder, no `..`), else `frame_NNNN.EXT`.
    pub fn file_name(&self) -> String {
        let plain = |n: &String| {
            let mut parts = std::path::Path::new(n).components();
            matches!(parts.next(), Some(std::path::Component::Normal(_))) && parts.next().is_none()
        };
        self.name
            .clone()
            .filter(plain)
            .unwrap_or_else(|| format!("frame_{:04}.{}", self.frame, self.format.extension()))
    }
}

/// `status JOB`: a job with what it is made of.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobDetail {
    pub status: JobStatus,
    /// The job's frames, in its order, as runs of frames in one state
    /// (at most [`MAX_DETAIL_RUNS`]; `frames_cut` when there were more).
    pub frames: Vec<FrameRun>,
    pub frames_cut: bool,
    /// The latest failed attempts (at most [`MAX_DETAIL_ATTEMPTS`]),
    /// oldest first; `tessera logs` has them all, with the logs.
    pub attempts: Vec<Attempt>,
    pub attempts_total: u32,
    /// Workers with accepted results of the job or tasks of it running.
    pub workers: Vec<JobWorker>,
    /// What the submitting client's scan warned of (the spec's
    /// `warnings`). Since version 20.
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// The most frame runs and attempts a [`JobDetail`] carries.
pub const MAX_DETAIL_RUNS: usize = 2048;
pub const MAX_DETAIL_ATTEMPTS: usize = 100;

/// Frames `first..=last` of a job's frame list (`count` of them), all in
/// `state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameRun {
    pub first: u32,
    pub last: u32,
    pub count: u32,
    pub state: FrameState,
}

/// A frame's state; lowercase in JSON, like every other name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameState {
    /// Stitched: downloadable.
    Done,
    /// A task of it is leased to a worker.
    Rendering,
    /// Waiting for a worker (or, once the job ended, never finished).
    Waiting,
}

crate::json_lowercase!(FrameState {
    Done = "done" | "Done",
    Rendering = "rendering" | "Rendering",
    Waiting = "waiting" | "Waiting",
});

impl FrameState {
    pub fn name(self) -> &'static str {
        match self {
            FrameState::Done => "done",
            FrameState::Rendering => "rendering",
            FrameState::Waiting => "waiting",
        }
    }
}

/// One failed attempt, without its log.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Attempt {
    pub task: u32,
    /// The frame the task renders (its first, for an Unreal chunk).
    pub frame: Option<u32>,
    pub worker: u64,
    /// The worker's name, when it is still connected under that id.
    pub worker_name: Option<String>,
    pub unix_ms: u64,
    pub error: String,
}

/// A worker's share of a job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobWorker {
    pub name: String,
    pub tasks_done: u32,
    pub render_ms: u64,
    /// Tasks of the job it renders now (0 when it is gone or idle).
    pub running: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(name: &str, usd: f64) -> FleetReport {
        FleetReport {
            nodes: vec![FleetNode {
                name: name.into(),
                node: "i-1".into(),
                gpu: "RTX".into(),
                usd_per_hour: 1.0,
                state: "joined".into(),
                secs: 1.0,
                usd,
            }],
            replaced: 0,
            billed_usd: usd,
            attributed_to_jobs_usd: 0.0,
            farm_overhead_usd: 0.0,
            billed_gpu_hours: 0.0,
            rendered_gpu_hours: 0.0,
        }
    }

    #[test]
    fn a_fleet_report_is_checked_and_a_fleet_makes_its_names_fit() {
        assert!(report("a", 1.0).check().is_ok());
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            assert!(report("a", bad).check().is_err(), "{bad}");
        }
        let mut long = report(&format!("é\u{1b}[31m{}", "x".repeat(400)), 1.0);
        assert!(long.check().is_err());
        long.fit();
        assert!(long.check().is_ok());
        let name = &long.nodes[0].name;
        assert!(
            name.starts_with("é?[31m") && name.len() <= MAX_FLEET_TEXT,
            "{name}"
        );
        let mut many = report("a", 1.0);
        many.nodes = vec![many.nodes[0].clone(); MAX_FLEET_NODES + 1];
        assert!(many.check().is_err());
    }

    #[test]
    fn a_price_is_an_amount_from_zero_to_the_bound() {
        use crate::messages::{check_price, MAX_PRICE_PER_HOUR};
        for ok in [0.0, 0.45, MAX_PRICE_PER_HOUR] {
            assert!(check_price(ok).is_ok(), "{ok}");
        }
        for bad in [-0.01, 1e308, f64::INFINITY, f64::NAN] {
            assert!(check_price(bad).is_err(), "{bad}");
        }
    }
}
