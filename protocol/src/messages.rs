//! The message enums. A connection opens one bidirectional *control* stream
//! and says `Hello`; after `Welcome::Accepted`, workers exchange
//! [`WorkerMsg`]/[`CoordMsg`] and clients send [`ClientRequest`]s, each
//! answered by one [`ClientResponse`]. Blob bytes travel on streams of their
//! own, each opened with a [`BlobRequest`] frame, so an upload never delays a
//! heartbeat.

use serde::{Deserialize, Serialize};

use crate::blender::{BlenderNeeds, BlenderOffer};
use crate::build::BuildInfo;
use crate::chunk::{ChunkList, Recipe};
use crate::job::{Engine, JobSpec, ManifestEntry, OutputFormat, TileRect};
use crate::telemetry::Telemetry;
use crate::Digest;

/// Outputs up to this size travel inside `WorkerMsg::Done`.
pub const MAX_INLINE_OUTPUT: usize = 64 * 1024;

/// The longest renderer log a failed attempt carries (its tail is kept).
pub const MAX_TASK_LOG: usize = 64 * 1024;

/// The most slots (concurrent tasks) a worker may claim; the coordinator
/// caps a larger claim to this.
pub const MAX_SLOTS: u32 = 256;

/// The most cached-file digests the coordinator keeps for one worker (for
/// cache affinity); more are ignored, so a worker cannot grow the
/// coordinator's memory by claiming files.
pub const MAX_CACHED_DIGESTS: usize = 100_000;

/// Why a worker's price is refused: it must be a finite number ≥ 0, or
/// every lease it bills would be NaN, infinite or a credit.
pub fn check_price(price_per_hour: f64) -> Result<(), String> {
    if price_per_hour.is_finite() && price_per_hour >= 0.0 {
        Ok(())
    } else {
        Err(format!(
            "price per hour {price_per_hour} is not a finite amount of at least 0"
        ))
    }
}

/// Bumped whenever a message changes shape or meaning (11: a worker may
/// be assigned more tasks than it has slots, and renders at most its slots'
/// worth at once, the others queued in the order assigned; 12: job filters,
/// job details, retry and request-id conflicts for clients; 13: a job
/// may wait for others (`after`) or be submitted paused; 14: a manifest
/// file may belong to one frame, fetched only for that frame's tasks; 15:
/// a job's task time limit; 16: a joining worker says it is draining, and
/// a recorded failure is acknowledged; 17: a client's error carries its
/// [`ErrorKind`]).
pub const PROTOCOL_VERSION: u32 = 18;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Worker,
    Client,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    pub version: u32,
    pub role: Role,
    pub secret: String,
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Welcome {
    Accepted { version: u32 },
    Refused { reason: String },
}

/// Identifies one lease of one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskRef {
    pub job: u64,
    pub index: u32,
    pub epoch: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerInfo {
    pub engines: Vec<Engine>,
    pub slots: u32,
    pub price_per_hour: f64,
    pub hostname: String,
    /// Tasks the worker still renders, or rendered and has not had
    /// acknowledged, from an earlier connection: the coordinator adopts
    /// the leases it can and cancels the others.
    pub holding: Vec<TaskRef>,
    /// A spot or interruptible instance that may vanish at any moment:
    /// `--sample-ranges auto` then splits tiles into sample ranges.
    pub interruptible: bool,
    /// Every file its asset cache holds, for cache-affinity scheduling.
    pub cached: Vec<Digest>,
    /// Every Blender it offers (one worker may offer several), and what
    /// each can do; empty when it offers no Blender.
    pub blenders: Vec<BlenderOffer>,
    /// Started with `--blender auto`: it also offers every Blender build
    /// stored with `blender add` ([`BuildInfo::offer`]), fetching one the
    /// first time a job needs it.
    pub fetches_builds: bool,
    /// Asked to drain over an earlier connection: it takes no new work and
    /// leaves once what it holds is done.
    pub draining: bool,
}

/// Worker → coordinator, on the control stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WorkerMsg {
    Join(WorkerInfo),
    /// Renews every lease the worker holds; carries telemetry now and then.
    Heartbeat {
        telemetry: Option<Telemetry>,
    },
    /// A finished task. Small outputs travel `inline`; larger ones were
    /// uploaded as a blob first. Either way `output` names the bytes.
    Done {
        task: TaskRef,
        output: Digest,
        render_ms: u64,
        inline: Option<Vec<u8>>,
    },
    Failed {
        task: TaskRef,
        /// One line a person can read.
        error: String,
        /// The renderer's own output around the failure (at most
        /// [`MAX_TASK_LOG`] bytes), for `tessera logs`.
        log: String,
        /// The worker cannot render this job at all (its renderer lacks a
        /// feature the scene needs): give it no more of the job.
        unsupported: bool,
    },
    /// Shutting down: give me no new work (running tasks may still finish).
    Draining,
    /// What the worker's asset cache gained and lost since it last said.
    Cached {
        added: Vec<Digest>,
        removed: Vec<Digest>,
    },
    /// Samples rendered so far of a running task, and what it is doing
    /// before it renders any (an Unreal shader compile).
    Progress {
        task: TaskRef,
        done: u32,
        total: u32,
        stage: Option<String>,
    },
    /// The answer to [`CoordMsg::Scan`]: the scan's JSON (at most
    /// [`MAX_SCAN_JSON`] bytes), or why the worker could not scan.
    Scanned {
        id: u64,
        result: Result<String, String>,
    },
}

/// The most a farm scan's JSON may take (a worker is not trusted).
pub const MAX_SCAN_JSON: usize = 4 << 20;

/// What a worker needs to know about a job, sent once per connection before
/// its first task.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobInfo {
    pub job: u64,
    pub engine: Engine,
    pub scene: String,
    pub manifest: Vec<ManifestEntry>,
    pub resolution: (u32, u32),
    pub output: OutputFormat,
    /// For Blender jobs: which Blender may render it.
    pub blender: Option<BlenderNeeds>,
    /// For Unreal jobs: what Movie Render Queue renders.
    pub unreal: Option<Box<crate::unreal::UnrealJob>>,
    /// Frames end with a finishing task: every other task renders the
    /// scene's passes only (no compositor, no denoising, the denoising
    /// data kept), as an uncompressed multilayer OpenEXR.
    pub finish: bool,
    /// A task running longer fails with that reason (`submit
    /// --task-timeout`, or the coordinator's default).
    pub task_timeout_ms: Option<u64>,
}

/// What a finishing task composites: its frame's stitched passes, a
/// multilayer OpenEXR blob the worker fetches like a job file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StitchedPasses {
    pub digest: Digest,
    pub size: u64,
}

/// One task under one lease.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskSpec {
    pub task: TaskRef,
    pub frame: u32,
    pub tile: TileRect,
    /// Samples `[start, end)` of `total`.
    pub samples: (u32, u32),
    pub total_samples: u32,
    /// For Unreal jobs: the chunk of frames this task renders (`frame` is
    /// its first kept frame).
    #[serde(default)]
    pub unreal: Option<crate::unreal::UnrealTask>,
    /// A finishing task: run the scene's compositor and denoising on these
    /// passes of the whole frame and write the scene's output.
    pub finish: Option<StitchedPasses>,
}

impl TaskSpec {
    /// The frames whose files (`ManifestEntry::frame`) this task needs:
    /// its own, or for an Unreal chunk every frame (warm-up frames render
    /// before the kept ones).
    pub fn frames_needed(&self) -> std::ops::RangeInclusive<u32> {
        match self.unreal {
            Some(_) => 0..=u32::MAX,
            None => self.frame..=self.frame,
        }
    }
}

/// Coordinator → worker, on the control stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum CoordMsg {
    /// Sent once, first, to a worker that joined with the shared worker
    /// ticket: its own credential (`ID.SECRET`), which it keeps and shows
    /// instead of the ticket from then on.
    Enrolled {
        credential: String,
    },
    Joined {
        worker_id: u64,
        heartbeat_ms: u64,
        lease_ms: u64,
    },
    Job(JobInfo),
    /// A lease. A worker may hold more than its slots (pipelined leases):
    /// it fetches every assigned task's files at once, renders at most one
    /// task per slot, and starts the others in the order they came.
    Assign(TaskSpec),
    /// Stop working on this lease; its result would be refused.
    Cancel(TaskRef),
    /// Finish the running tasks, take no more, and leave.
    Drain,
    /// Reply to `Done`/`Failed`: the result is durable, or the failure
    /// recorded (`accepted`), or refused. Either way the worker forgets the
    /// task.
    Ack {
        task: TaskRef,
        accepted: bool,
        reason: Option<String>,
    },
    /// To a worker started with `--blender auto`, after `Joined` and
    /// whenever `blender add` records one: every stored Blender build.
    Builds(Vec<BuildInfo>),
    /// Scan the `.blend` blob `blend` for a client whose Blender cannot
    /// read it: list what it references as stored, with paths resolved
    /// against `path`, the artist's path of the file (nothing is looked up
    /// on the worker's disk). Saved by Blender `version`; the worker
    /// answers with [`WorkerMsg::Scanned`].
    Scan {
        id: u64,
        blend: Digest,
        path: String,
        version: crate::blender::BlenderVersion,
    },
}

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

/// Client → coordinator, on the control stream; each gets one response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ClientRequest {
    /// Which of these blobs (whole files or chunks) does the coordinator lack?
    MissingBlobs(Vec<Digest>),
    /// Which files did these chunk lists (`ChunkList::id`) make here? A
    /// client names a large file by its chunk list. Answered by `Known`.
    KnownLists(Vec<Digest>),
    /// Store a large file by joining its chunks, all of them uploaded
    /// before; the coordinator hashes the joined file. Answered by
    /// `Assembled` with its digest.
    Assemble(ChunkList),
    Submit(JobSpec),
    /// One job, or every job when `None`.
    Status(Option<u64>),
    Cancel(u64),
    /// The stitched frames of a job so far.
    Frames(u64),
    /// The failed attempts of a job (of one task), with the renderer's log.
    Logs {
        job: u64,
        task: Option<u32>,
    },
    /// Turn this connection into a feed: a `Snapshot` now and regularly,
    /// and every `Event` as it happens. No further requests are read.
    Subscribe,
    /// Every tile of one frame of a job.
    Tiles {
        job: u64,
        frame: u32,
    },
    /// Stop (or resume) handing out a job's tasks; running ones finish.
    Pause {
        job: u64,
        paused: bool,
    },
    /// Ask a worker to finish its tasks and leave.
    Drain {
        worker: u64,
    },
    /// Collect garbage now: remove stored blobs no retained job uses.
    /// Answered by `Collected`.
    CollectGarbage,
    /// Record a Blender build: the digest of its `BuildManifest` blob, whose
    /// files were all uploaded before. Answered by `BuildAdded`.
    AddBuild(Digest),
    /// The Blender builds the coordinator holds. Answered by `Builds`.
    Builds,
    /// Revoke every worker enrolled under `name`: disconnected now, refused
    /// from then on. Answered by `Revoked`.
    RevokeWorker {
        name: String,
    },
    /// Replace both tickets' secrets: the old tickets are refused for new
    /// connections; enrolled workers keep their credentials. Answered by
    /// `Tickets`.
    RotateTickets,
    /// One page of `Status(None)`: jobs with ids above `after_job` and
    /// workers with ids above `after_worker`, each list as long as fits one
    /// page. Answered by `StatusPage`.
    StatusPage {
        after_job: u64,
        after_worker: u64,
    },
    /// One page of `Logs`: entries after the cursor `after` (0 first).
    /// Answered by `LogsPage`.
    LogsPage {
        job: u64,
        task: Option<u32>,
        after: u64,
    },
    /// One page of `Frames`: frames above `after` (all with `None`).
    /// Answered by `FramesPage`.
    FramesPage {
        job: u64,
        after: Option<u32>,
    },
    /// Scan an uploaded `.blend` on a worker whose Blender can read it
    /// (see [`CoordMsg::Scan`]). Answered by `Scanned`.
    Scan {
        blend: Digest,
        path: String,
        version: crate::blender::BlenderVersion,
    },
    /// Put a failed job back in the queue: the tasks without a result are
    /// rendered again. Answered by `Retried`.
    Retry(u64),
    /// One job in detail: its frames by state, its latest failed attempts
    /// and the workers rendering it or that rendered it. Answered by
    /// `JobDetail`.
    JobDetail(u64),
    /// One page of the jobs that match `filter`, with ids above `after`
    /// (0 first), oldest first. Answered by `JobsPage`.
    JobsPage {
        filter: JobFilter,
        after: u64,
    },
    /// The frames of a job stitched after the cursor `after` (0 first), in
    /// the order they were stitched: what `wait` polls, reading only what
    /// is new. Answered by `NewFrames`.
    NewFrames {
        job: u64,
        after: u64,
    },
}

/// Which jobs a `status` (or the HTTP API) lists. Every part that is given
/// must match; an empty filter matches every job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobFilter {
    /// Any of these states (every state when empty).
    pub states: Vec<JobState>,
    /// The job's name: exactly, or as a glob when it holds `*` or `?`
    /// (`sh0*`); case-sensitive.
    pub name: Option<String>,
    /// Submitted at or after this wall-clock time (unix ms).
    pub since_unix_ms: Option<u64>,
    /// Only these job ids (every id when empty).
    pub ids: Vec<u64>,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FrameState {
    /// Stitched: downloadable.
    Done,
    /// A task of it is leased to a worker.
    Rendering,
    /// Waiting for a worker (or, once the job ended, never finished).
    Waiting,
}

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

/// The most ids (and states) one [`JobFilter`] may name.
pub const MAX_FILTER_IDS: usize = 10_000;

impl JobFilter {
    /// Refuses a filter too large to be a reasonable question.
    pub fn check(&self) -> Result<(), String> {
        if self.ids.len() > MAX_FILTER_IDS || self.states.len() > MAX_FILTER_IDS {
            return Err(format!(
                "a status filter names at most {MAX_FILTER_IDS} job ids"
            ));
        }
        if self
            .name
            .as_ref()
            .is_some_and(|n| n.len() > crate::text::MAX_NAME * 4)
        {
            return Err(format!(
                "a name pattern is at most {} bytes",
                crate::text::MAX_NAME * 4
            ));
        }
        Ok(())
    }

    /// Whether a job of this state, name and submit time passes.
    pub fn matches(&self, id: u64, state: JobState, name: &str, submitted_unix_ms: u64) -> bool {
        (self.ids.is_empty() || self.ids.contains(&id))
            && (self.states.is_empty() || self.states.contains(&state))
            && self.since_unix_ms.is_none_or(|t| submitted_unix_ms >= t)
            && self.name.as_deref().is_none_or(|p| name_matches(p, name))
    }
}

/// `pattern` against `name`: `*` is any run of characters, `?` any one;
/// anything else is itself.
pub fn name_matches(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // Iterative glob with one backtrack point: linear in practice, and at
    // worst quadratic (bounded by the pattern's length cap).
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// The most items one page carries; fewer when their encoding would pass
/// [`PAGE_BYTES`]. Every reply fits its frame: a list too long for one is
/// asked for page by page.
pub const PAGE_ITEMS: usize = 256;
/// The most bytes a page's items take encoded (a quarter of a frame).
pub const PAGE_BYTES: usize = crate::codec::MAX_FRAME as usize / 4;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ClientResponse {
    Missing(Vec<Digest>),
    /// The file each asked chunk list made, in order, if any.
    Known(Vec<Option<Digest>>),
    /// The digest of the file an `Assemble` stored.
    Assembled(Digest),
    Submitted(JobStatus),
    Status {
        jobs: Vec<JobStatus>,
        workers: Vec<WorkerStatus>,
    },
    Canceled(JobStatus),
    Frames(Vec<FrameOutput>),
    Logs(Vec<TaskLog>),
    Snapshot(Snapshot),
    Event {
        unix_ms: u64,
        event: FarmEvent,
    },
    Tiles(Vec<TileStatus>),
    Collected(Collected),
    /// How many identities a `RevokeWorker` revoked, and how many
    /// connections it closed.
    Revoked {
        identities: u32,
        disconnected: u32,
    },
    /// The new tickets, as lines.
    Tickets {
        worker: String,
        client: String,
    },
    Done,
    /// The request was refused or failed: the kind says which (clients act
    /// on it, never on the words), the message says what to do.
    Error(ClientError),
    BuildAdded(BuildInfo),
    Builds(Vec<BuildInfo>),
    /// `more`: either list goes on past this page.
    StatusPage {
        jobs: Vec<JobStatus>,
        workers: Vec<WorkerStatus>,
        more: bool,
    },
    /// `next`: the cursor of the next page, if there is one.
    LogsPage {
        logs: Vec<TaskLog>,
        next: Option<u64>,
    },
    FramesPage {
        frames: Vec<FrameOutput>,
        next: Option<u32>,
    },
    /// A farm scan's JSON (unchecked beyond its size: the client bounds
    /// what it reads), and the worker that ran it.
    Scanned {
        worker: String,
        json: String,
    },
    JobDetail(Box<JobDetail>),
    Retried(JobStatus),
    /// `next`: ask again with `after: next` for more; `None`: that was all.
    JobsPage {
        jobs: Vec<JobStatus>,
        next: Option<u64>,
    },
    /// `next`: the cursor to ask with next (the one asked with when nothing
    /// is new); `more`: frames past this page are already waiting.
    NewFrames {
        frames: Vec<FrameOutput>,
        next: u64,
        more: bool,
    },
}

/// What kind of failure a client's request met. Both APIs carry it: QUIC in
/// [`ClientResponse::Error`], HTTP as the status code (404, 409, 400, 401,
/// 503, 500) and the error body's `kind`. Clients (the CLI's exit codes,
/// the Python client's exceptions) follow the kind, never the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorKind {
    /// No such job, worker, frame or build.
    NotFound,
    /// The job (or worker) is in a state that forbids the request: cancel
    /// of a finished job, retry of one that did not fail, a request id
    /// reused for another submit.
    Conflict,
    /// The request itself is wrong: a spec out of bounds, a file not
    /// uploaded, a hostile path.
    Invalid,
    /// A missing or wrong secret.
    Unauthorized,
    /// The farm cannot do it now, but may later: no worker to ask, one
    /// that left or did not answer in time. Asking again may succeed.
    Unavailable,
    /// The coordinator failed (its database, its store): not the client's
    /// doing.
    Internal,
}

impl ErrorKind {
    /// Every kind, in the order of the README's table.
    pub const ALL: [ErrorKind; 6] = [
        ErrorKind::NotFound,
        ErrorKind::Conflict,
        ErrorKind::Invalid,
        ErrorKind::Unauthorized,
        ErrorKind::Unavailable,
        ErrorKind::Internal,
    ];

    /// The kind as the HTTP API's error body names it.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Invalid => "invalid",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Internal => "internal",
        }
    }

    /// The HTTP status code the API answers this kind with.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorKind::NotFound => 404,
            ErrorKind::Conflict => 409,
            ErrorKind::Invalid => 400,
            ErrorKind::Unauthorized => 401,
            ErrorKind::Unavailable => 503,
            ErrorKind::Internal => 500,
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A refused or failed client request: its [`ErrorKind`] and a one-line
/// message saying what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ClientError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ClientError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ClientError {
        ClientError {
            kind,
            message: message.into(),
        }
    }

    pub fn not_found(message: impl Into<String>) -> ClientError {
        ClientError::new(ErrorKind::NotFound, message)
    }

    pub fn conflict(message: impl Into<String>) -> ClientError {
        ClientError::new(ErrorKind::Conflict, message)
    }

    pub fn invalid(message: impl Into<String>) -> ClientError {
        ClientError::new(ErrorKind::Invalid, message)
    }

    pub fn unavailable(message: impl Into<String>) -> ClientError {
        ClientError::new(ErrorKind::Unavailable, message)
    }

    pub fn internal(message: impl Into<String>) -> ClientError {
        ClientError::new(ErrorKind::Internal, message)
    }
}

/// The longest prefix of `items` that makes one page (at least one item):
/// at most [`PAGE_ITEMS`], their encoding within [`PAGE_BYTES`]. Returns it
/// and whether items were left out.
pub fn take_page<T: Serialize>(items: impl IntoIterator<Item = T>) -> (Vec<T>, bool) {
    let mut page = Vec::new();
    let mut bytes = 0usize;
    for item in items {
        let len = crate::codec::encode(&item).map_or(PAGE_BYTES, |b| b.len());
        if page.len() == PAGE_ITEMS || (!page.is_empty() && bytes + len > PAGE_BYTES) {
            return (page, true);
        }
        bytes += len;
        page.push(item);
    }
    (page, false)
}

/// What one garbage collection did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Collected {
    pub removed_blobs: u64,
    pub removed_bytes: u64,
    pub kept_blobs: u64,
    pub kept_bytes: u64,
}

/// First frame of a blob stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum BlobRequest {
    /// `len` raw bytes follow; the receiver re-hashes them.
    Put { digest: Digest, len: u64 },
    /// `job`: the job a worker fetches it for (counted as that job's
    /// bytes sent to workers).
    Get { digest: Digest, job: Option<u64> },
    /// The chunks of a large file, so a worker fetches only the chunks it
    /// lacks (and a cut download resumes).
    Recipe { digest: Digest },
    /// Several blobs on one stream (at most [`MAX_GET_MANY`]), answered in
    /// order: each `Found` with its bytes, or `NotFound`; a `Refused` one
    /// ends the stream. Chunks are small (16 KiB on average): one stream
    /// and round trip per chunk would hold a fetch on a long path to a few
    /// chunks per round trip.
    GetMany {
        digests: Vec<Digest>,
        job: Option<u64>,
    },
}

/// The most blobs one [`BlobRequest::GetMany`] names.
pub const MAX_GET_MANY: usize = 256;

/// The receiver's answer on a blob stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum BlobReply {
    Stored,
    Refused {
        reason: String,
    },
    /// `len` raw bytes follow.
    Found {
        len: u64,
    },
    Recipe(Recipe),
    NotFound,
}

#[cfg(test)]
mod page_tests {
    use super::*;

    #[test]
    fn a_filter_matches_names_by_glob_and_every_part_it_gives() {
        for (pattern, name, ok) in [
            ("sh010", "sh010", true),
            ("sh010", "sh0100", false),
            ("sh0*", "sh020", true),
            ("*", "", true),
            ("sh0?0", "sh030", true),
            ("sh0?0", "sh03", false),
            ("*lighting*", "sh010-lighting-v2", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
        ] {
            assert_eq!(name_matches(pattern, name), ok, "{pattern} {name}");
        }
        let f = JobFilter {
            states: vec![JobState::Failed, JobState::Canceled],
            name: Some("sh*".into()),
            since_unix_ms: Some(1000),
            ids: vec![],
        };
        assert!(f.matches(1, JobState::Failed, "sh010", 1000));
        assert!(!f.matches(1, JobState::Done, "sh010", 1000));
        assert!(!f.matches(1, JobState::Failed, "env", 1000));
        assert!(!f.matches(1, JobState::Failed, "sh010", 999));
        assert!(JobFilter::default().matches(7, JobState::Queued, "x", 0));
        let ids = JobFilter {
            ids: vec![3, 5],
            ..Default::default()
        };
        assert!(ids.matches(5, JobState::Done, "x", 0) && !ids.matches(4, JobState::Done, "x", 0));
    }

    #[test]
    fn a_page_holds_at_most_its_items_and_bytes_and_never_nothing() {
        let (page, more) = take_page(0..PAGE_ITEMS as u32 + 1);
        assert_eq!((page.len(), more), (PAGE_ITEMS, true));
        let (page, more) = take_page(0..3u32);
        assert_eq!((page, more), (vec![0, 1, 2], false));
        // Items of a megabyte: four fill the page's bytes.
        let big = vec![vec![7u8; 1 << 20]; 10];
        let (page, more) = take_page(big.iter());
        assert!(more && page.len() < 4, "{}", page.len());
        // One item larger than a page still goes, alone.
        let huge = vec![vec![0u8; PAGE_BYTES + 1]; 2];
        let (page, more) = take_page(huge.iter());
        assert_eq!((page.len(), more), (1, true));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every error kind travels on the wire with its message, and maps to
    /// its own HTTP status and name.
    #[test]
    fn an_error_carries_its_kind_on_the_wire() {
        let mut statuses = std::collections::HashSet::new();
        let mut names = std::collections::HashSet::new();
        for kind in ErrorKind::ALL {
            let sent = ClientResponse::Error(ClientError::new(kind, format!("{kind} here")));
            let bytes = crate::codec::encode(&sent).unwrap();
            let got: ClientResponse = crate::codec::decode_frame(&bytes).unwrap();
            match got {
                ClientResponse::Error(e) => {
                    assert_eq!(
                        (e.kind, e.message.as_str()),
                        (kind, &*format!("{kind} here"))
                    )
                }
                other => panic!("{other:?}"),
            }
            assert!(statuses.insert(kind.http_status()), "{kind}");
            assert!(names.insert(kind.name()), "{kind}");
        }
        assert_eq!(
            ErrorKind::ALL.map(ErrorKind::http_status),
            [404, 409, 400, 401, 503, 500]
        );
    }
}
