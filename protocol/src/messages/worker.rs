//! Worker ⇄ coordinator on the control stream: what a worker says
//! ([`WorkerMsg`]) and what it is told ([`CoordMsg`]).

use serde::{Deserialize, Serialize};

use crate::blender::{BlenderNeeds, BlenderOffer};
use crate::build::BuildInfo;
use crate::job::{Engine, ManifestEntry, OutputFormat, TileRect};
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

/// The highest price per hour a worker may ask, in USD: far above any
/// rented GPU node, and low enough that no sum of leases, burn rate or
/// job cost overflows to infinity.
pub const MAX_PRICE_PER_HOUR: f64 = 1_000_000.0;

/// Why a worker's price is refused: it must be a finite number from 0 to
/// [`MAX_PRICE_PER_HOUR`], or the leases it bills would be NaN, infinite
/// (or add up to it) or a credit.
pub fn check_price(price_per_hour: f64) -> Result<(), String> {
    if (0.0..=MAX_PRICE_PER_HOUR).contains(&price_per_hour) {
        Ok(())
    } else {
        Err(format!(
            "price per hour {price_per_hour} is not an amount from 0 to {MAX_PRICE_PER_HOUR} USD"
        ))
    }
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
    /// Its machine (GPUs, memory, cores, OS), for jobs with host needs.
    /// Since version 20; `None` from older workers, which get no job that
    /// has host needs.
    #[serde(default)]
    pub host: Option<Box<crate::host::HostFacts>>,
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
        /// Bytes, not a list of numbers, in MessagePack (bincode writes
        /// both alike).
        #[serde(with = "serde_bytes")]
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
    /// For Blender jobs: the format Blender writes whole frames in instead
    /// of the file's own ([`crate::job::JobSpec::render_format`]).
    #[serde(default)]
    pub render_format: Option<crate::blender::ImageFormat>,
    /// For ffmpeg jobs: how the frames (laid out under
    /// [`crate::encode::INPUT_DIR`]) are encoded, and the movie's name.
    #[serde(default)]
    pub encode: Option<EncodeJob>,
}

/// An encode job as a worker runs it: the options, and the movie's file
/// name (its extension picks the container).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncodeJob {
    pub spec: crate::encode::EncodeSpec,
    pub movie: String,
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
        /// The farm's assets are in an object store: the worker may ask
        /// where to fetch them itself ([`crate::messages::BlobRequest::Locate`]).
        #[serde(default)]
        store_urls: bool,
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
