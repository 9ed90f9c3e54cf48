//! `tessera`: the one binary of the farm — coordinator, worker, the client
//! commands artists and scripts use, and the one-command demo.

mod demo;
mod fleet;
mod monitor;

use tessera_client::{
    build, client, exit, follow, openjd, progress, report, share, shown, uproject,
};

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tessera_coordinator::server::{HttpListen, Webhook};
use tessera_protocol::job::{Engine, TileGrid};
use tessera_protocol::messages::{JobFilter, JobState, MAX_SLOTS};
use tessera_worker::engine::{self, blender, blender_runtime};

use crate::client::{Client, SubmitOptions};

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "A distributed render farm for rented GPUs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
struct TicketArg {
    /// Client ticket (the line in DATA_DIR/client.ticket), or @FILE holding it.
    #[arg(long, env = "TESSERA_TICKET", hide_env_values = true)]
    ticket: Option<String>,
}

#[derive(Subcommand)]
enum FleetCommand {
    /// Rent, watch and release worker nodes for the queue, as the fleet
    /// file says, until SIGINT or SIGTERM (then every node is released).
    Run {
        /// The fleet file (TOML): providers, limits, the worker image.
        #[arg(long, default_value = "fleet.toml")]
        config: PathBuf,
        /// Write the fleet's nodes, billed cost and GPU-hours here (JSON),
        /// every tick.
        #[arg(long)]
        status_file: Option<PathBuf>,
        /// How often the fleet looks at the farm, milliseconds.
        #[arg(long, default_value_t = 1000, hide = true)]
        tick_ms: u64,
        #[command(flatten)]
        ticket: TicketArg,
    },
    /// A dry run: which offers the fleet would rent for the queue now, for
    /// how long, the estimated cost and finish time. Rents nothing.
    Plan {
        #[arg(long, default_value = "fleet.toml")]
        config: PathBuf,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ticket: TicketArg,
    },
}

#[derive(Subcommand)]
enum BlenderCommand {
    /// Store an official Blender build on the coordinator: an unpacked
    /// folder, a `bpy` wheel (.whl) or a Linux tarball (.tar.xz). Its files
    /// are uploaded like scene files, so the next point release sends only
    /// what changed.
    Add {
        path: PathBuf,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ticket: TicketArg,
    },
    /// The builds the coordinator holds.
    List {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ticket: TicketArg,
    },
}

#[derive(Subcommand)]
enum Command {
    /// Run the coordinator: schedules jobs, stores assets, stitches frames.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Coordinator {
        #[command(subcommand)]
        admin: Option<CoordinatorAdmin>,
        /// Where state, assets, the certificate and the tickets live.
        #[arg(long, required = true)]
        data_dir: Option<PathBuf>,
        /// Address to listen on (UDP). Port 0 picks a free port, and keeps it
        /// across restarts with the same data dir.
        #[arg(long, default_value = "127.0.0.1:7700")]
        listen: SocketAddr,
        /// Address written into tickets, when workers reach this machine by
        /// another address than --listen (e.g. a public IP).
        #[arg(long)]
        advertise: Option<SocketAddr>,
        /// How often workers send heartbeats, in milliseconds.
        #[arg(long, default_value_t = 1000)]
        heartbeat_ms: u64,
        /// How long a lease lives without a heartbeat, in milliseconds. Keep
        /// it under three heartbeats: a lost worker's tasks then restart
        /// elsewhere within three heartbeat intervals.
        #[arg(long, default_value_t = 2500)]
        lease_ms: u64,
        /// Hand tasks out without preferring workers that already hold
        /// their assets (for comparisons).
        #[arg(long)]
        no_cache_affinity: bool,
        /// Hand each worker slot only the task it renders, not its next
        /// ones too (pipelined leases are on by default; for comparisons).
        #[arg(long)]
        no_pipelining: bool,
        /// The congestion controller for what this process sends:
        /// `cubic-veno` (the default: CUBIC that cuts its window less for a
        /// loss seen with no queue behind it), quinn's `cubic` or `newreno`,
        /// or `bbr` (fast on paths that drop packets at random, but it
        /// resends much more where a slow link's queue overflows; see
        /// BENCHMARKS.md).
        #[arg(long, default_value = "cubic-veno", value_parser = tessera_coordinator::Congestion::parse)]
        congestion: tessera_coordinator::Congestion,
        /// How long a finished job's assets and frames are kept before
        /// garbage collection may remove them (e.g. 7d, 12h, 30m, 0s).
        #[arg(long, default_value = "7d", value_parser = parse_duration)]
        retention: std::time::Duration,
        /// How fast the background scrub re-reads stored blobs to catch
        /// ones that rotted on disk, in MB/s (0: no scrub).
        #[arg(long, default_value_t = 16.0)]
        scrub_mb_per_sec: f64,
        /// End any task that runs longer than this (e.g. 2h) in jobs
        /// submitted without their own --task-timeout; the attempt fails
        /// with that reason and is retried like any failure.
        #[arg(long, value_parser = parse_duration)]
        task_timeout: Option<std::time::Duration>,
        /// Serve the HTTP/JSON API and /metrics over TLS (the coordinator's
        /// certificate; the client ticket's secret as bearer). Alone: on
        /// TCP at the --listen port, so the client ticket names it; or at
        /// HOST:PORT. The URL is written to DATA_DIR/http.url.
        #[arg(long, num_args = 0..=1, default_missing_value = "ticket", value_name = "HOST:PORT")]
        http: Option<String>,
        /// POST job done, failed and blocked events to this http:// URL,
        /// signed with HMAC-SHA256 (X-Tessera-Signature); retried with
        /// backoff until the receiver answers 2xx, across restarts.
        #[arg(long, value_name = "URL")]
        webhook: Option<String>,
        /// The file holding the webhook's signing secret (else the
        /// TESSERA_WEBHOOK_SECRET environment variable).
        #[arg(long, value_name = "FILE")]
        webhook_secret_file: Option<PathBuf>,
        /// The first wait before a failed webhook delivery is retried, in
        /// milliseconds; it doubles with each failure, up to
        /// --webhook-max-backoff-ms.
        #[arg(long, default_value_t = 500, hide = true)]
        webhook_backoff_ms: u64,
        /// The longest wait between webhook retries, in milliseconds.
        #[arg(long, default_value_t = 30_000, hide = true)]
        webhook_max_backoff_ms: u64,
    },
    /// Run a worker: joins the farm with a worker ticket and renders tasks.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Worker {
        #[command(subcommand)]
        admin: Option<WorkerAdmin>,
        /// Worker ticket (the line in DATA_DIR/worker.ticket), or @FILE holding it.
        #[arg(
            long,
            env = "TESSERA_WORKER_TICKET",
            hide_env_values = true,
            required = true
        )]
        ticket: Option<String>,
        /// Name shown in status and the monitor (default: host name and pid).
        #[arg(long)]
        name: Option<String>,
        /// Where fetched assets are kept.
        #[arg(long, env = "TESSERA_CACHE_DIR")]
        cache_dir: Option<PathBuf>,
        /// Cap on the asset cache (e.g. 50G, 800M, or bytes): least recently
        /// used assets are evicted, never those of a running task.
        #[arg(long, value_parser = parse_size)]
        cache_max: Option<u64>,
        /// Engine to offer: auto (every engine available here), builtin, blender, unreal.
        #[arg(long, default_value = "auto")]
        engine: String,
        /// Concurrent tasks: a count, or `auto` (one per GPU that NVML
        /// finds, else one per CPU core).
        #[arg(long, default_value = "1", value_parser = parse_slots)]
        slots: Slots,
        /// Render threads per slot for CPU engines (default: cores ÷ slots).
        #[arg(long)]
        threads: Option<usize>,
        /// What this node costs, for cost accounting (a finite amount ≥ 0).
        #[arg(long, default_value_t = 0.0, value_parser = parse_price)]
        price_per_hour: f64,
        /// Cycles device: CPU, CUDA, OPTIX, HIP, ONEAPI (one slot per GPU),
        /// or `auto`: the first of OPTIX, CUDA, HIP, ONEAPI that Cycles
        /// finds here, else CPU. A GPU that fails its probe render at start
        /// is an error, never a silent fall-back to the CPU.
        #[arg(long, default_value = "CPU", value_parser = parse_device)]
        blender_device: DeviceArg,
        /// A Blender executable to offer (or an unpacked official build's
        /// folder); repeat for several. Default: $TESSERA_BLENDER, else
        /// `blender` on the PATH. `auto`: also offer every build stored with
        /// `tessera blender add`, fetched into the cache the first time a
        /// job needs it (then no Blender need be installed here).
        #[arg(long = "blender")]
        blenders: Vec<PathBuf>,
        /// The Python 3.11 that stored `bpy` builds run in with `--blender
        /// auto` (it needs numpy, zstandard and requests installed; an
        /// official Linux tarball needs nothing).
        #[arg(long, default_value = "python3.11")]
        build_python: PathBuf,
        /// A Python interpreter in which `import bpy` works (PyPI's `bpy`,
        /// the official Blender as a module) to offer; repeat for several.
        #[arg(long)]
        blender_python: Vec<PathBuf>,
        /// Seconds running tasks may take to finish before their leases are
        /// handed back once the worker drains. On SIGTERM the default is 0
        /// (hand them back at once); asked by `tessera drain`, running tasks
        /// finish however long they take unless this is given.
        #[arg(long, value_parser = parse_seconds)]
        drain_grace: Option<std::time::Duration>,
        /// A Blender renderer that prints nothing and uses (almost) no CPU
        /// for this long, as a hung one does, is ended and its task fails as
        /// stalled. A render that works keeps its process busy and is left
        /// alone however long it is silent (Cycles prints its progress
        /// rarely in the background); one that spins without output is
        /// ended by the job's --task-timeout.
        #[arg(long, default_value = "10m", value_parser = parse_duration)]
        stall_window: std::time::Duration,
        /// A renderer session with no task for this long is ended (it holds
        /// memory, and an idle `bpy` session keeps a core busy); the next
        /// task starts a fresh one. 0: keep sessions until the worker stops.
        #[arg(long, default_value = "2m", value_parser = parse_duration)]
        session_idle: std::time::Duration,
        /// Start Blender afresh for every task instead of keeping a session.
        #[arg(long, hide = true)]
        blender_cold: bool,
        /// This is a spot or interruptible instance that may be preempted at
        /// any moment: jobs submitted with `--sample-ranges auto` then split
        /// tiles into sample ranges, so a preemption loses at most one.
        #[arg(long)]
        interruptible: bool,
        /// For benchmarks: milliseconds each task of the noop engine takes.
        #[arg(long, hide = true, default_value_t = 0)]
        noop_ms: u64,
        /// Unreal's `UnrealEditor-Cmd` (for `--engine unreal`, or offered
        /// beside the others with `auto`): renders Movie Render Queue jobs.
        #[arg(long)]
        unreal_editor: Option<PathBuf>,
        /// The congestion controller for what this process sends:
        /// `cubic-veno` (the default: CUBIC that cuts its window less for a
        /// loss seen with no queue behind it), quinn's `cubic` or `newreno`,
        /// or `bbr` (fast on paths that drop packets at random, but it
        /// resends much more where a slow link's queue overflows; see
        /// BENCHMARKS.md).
        #[arg(long, default_value = "cubic-veno", value_parser = tessera_worker::Congestion::parse)]
        congestion: tessera_worker::Congestion,
        /// Leave after this long (e.g. 10m) holding no task and assigned
        /// none, whether connected to a coordinator with no work or unable
        /// to reach one: a node whose fleet is gone stops by itself. `tessera
        /// fleet` sets it on every node it launches.
        #[arg(long, value_parser = parse_duration)]
        exit_after_idle: Option<std::time::Duration>,
    },
    /// Submit a scene: uploads what the farm lacks, then queues the job.
    Submit {
        /// A .blend file or a builtin *.scene.json file.
        scene: PathBuf,
        /// Frames to render: 1-250, 1,5,9 or a mix (default: the scene's range).
        #[arg(long)]
        frames: Option<String>,
        /// Split each frame into COLSxROWS tiles.
        #[arg(long, default_value = "1x1")]
        tiles: TileGrid,
        /// Split each tile's samples into K ranges rendered as separate tasks
        /// and merged exactly; `auto`: split into 4 when the farm has
        /// interruptible workers, so a preemption loses at most one range.
        #[arg(long, default_value = "1", value_parser = parse_sample_ranges)]
        sample_ranges: u32,
        /// Override the scene's sample count.
        #[arg(long)]
        samples: Option<u32>,
        /// Check results from untrusted hosts: render P % of the tasks (and
        /// each worker's first result) again on a worker of another identity
        /// and compare them bit-exactly; a worker caught returning wrong
        /// pixels is quarantined and its results are rendered again.
        #[arg(long, default_value = "0")]
        verify: u32,
        /// When the job should be done, from now (e.g. 2h, 90m): `tessera
        /// fleet` rents enough nodes to meet it.
        #[arg(long, value_parser = parse_duration)]
        deadline: Option<std::time::Duration>,
        /// The most the job may cost, USD; what happens then is --on-budget.
        #[arg(long)]
        budget_usd: Option<f64>,
        /// When the budget is reached: `stop-dispatch` (hand out no more
        /// tasks, let running ones finish) or `cancel` (cancel the job and
        /// its running tasks).
        #[arg(long, default_value = "stop-dispatch", value_parser = tessera_protocol::job::OnBudget::parse)]
        on_budget: tessera_protocol::job::OnBudget,
        /// End any task that runs longer than this (e.g. 2h, 90m) and fail
        /// that attempt with the reason; it is retried like any failure
        /// (default: the coordinator's --task-timeout, else no limit).
        #[arg(long, value_parser = parse_duration)]
        task_timeout: Option<std::time::Duration>,
        /// With --wait: download the frames here, each as soon as it is
        /// stitched.
        #[arg(long)]
        output: Option<PathBuf>,
        /// With --output: replace files there that hold other frames.
        #[arg(long)]
        overwrite: bool,
        /// With --output: also fetch the finished frames if the job fails
        /// or is canceled.
        #[arg(long, requires = "output")]
        partial: bool,
        /// With --wait: give up waiting after this long (exit code 5).
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<std::time::Duration>,
        /// Job name (default: the scene's file name).
        #[arg(long)]
        name: Option<String>,
        /// Higher runs first.
        #[arg(long, default_value_t = 0)]
        priority: i32,
        /// Wait for the job to finish.
        #[arg(long)]
        wait: bool,
        /// Print one JSON object on stdout.
        #[arg(long)]
        json: bool,
        /// Scan, hash and upload, then print the job spec as JSON and
        /// submit nothing: the body to POST to the HTTP API's /v1/jobs.
        #[arg(long, conflicts_with_all = ["wait", "output"])]
        upload_only: bool,
        /// Makes a retried submit idempotent: the same id gets the same job.
        #[arg(long)]
        request_id: Option<String>,
        /// Start only once these jobs are done: JOB[,JOB...] (ids of jobs
        /// already submitted; an unknown id is refused).
        #[arg(long, value_parser = parse_after)]
        after: Option<AfterArg>,
        /// When a job named by --after fails or is canceled: `fail` this
        /// job too, or `hold` it until `tessera resume` (runs it anyway) or
        /// `tessera cancel`.
        #[arg(long, default_value = "fail", value_parser = parse_after_failure)]
        after_failure: tessera_protocol::job::AfterFailure,
        /// Hold the job until `tessera resume JOB`.
        #[arg(long)]
        paused: bool,
        /// Files of a per-frame sequence, such as a simulation cache:
        /// PATTERN is a path in the job folder (relative to the scene's
        /// folder) with a run of `#` for the frame number and `*` for any
        /// characters but `/`, e.g. `cache/fluid_data_####.vdb`. A worker
        /// fetches a frame's files only for that frame's tasks, instead of
        /// every file before its first task (repeat for several).
        #[arg(long = "frame-files", value_name = "PATTERN")]
        frame_files: Vec<String>,
        /// For an Open Job Description template: a job parameter's value,
        /// NAME=VALUE (repeat for several; others take their defaults).
        #[arg(long = "job-param")]
        job_params: Vec<String>,
        /// Submit even when files the scene uses are missing.
        #[arg(long)]
        allow_missing: bool,
        #[command(flatten)]
        share: Box<ShareArgs>,
        /// Force an engine instead of choosing by file type.
        #[arg(long, hide = true)]
        engine: Option<Engine>,
        /// Blender versions that may render it: `4.5`, or `'>=4.2'`
        /// (default: the major.minor of the Blender that saved the file).
        /// A Blender older than the file never gets it.
        #[arg(long)]
        blender: Option<tessera_protocol::blender::VersionReq>,
        /// A Python where `import bpy` works, for listing the file's
        /// dependencies when this machine's Blender cannot read it.
        #[arg(long, env = "TESSERA_BLENDER_PYTHON")]
        blender_python: Option<PathBuf>,
        /// How downloaded frames are named: `scene` (as the scene's output
        /// path names them, e.g. sh010_0001.exr) or `frame` (frame_0001.EXT).
        #[arg(long, default_value = "scene", value_parser = ["scene", "frame"])]
        frame_names: String,
        #[command(flatten)]
        unreal: UnrealArgs,
        #[command(flatten)]
        ticket: TicketArg,
    },
    /// Show jobs and workers, or one job in detail (its frames, failed
    /// attempts and workers). Filters narrow the list.
    Status {
        /// Job ids: one shows that job in detail; several list just those.
        jobs: Vec<u64>,
        /// Only jobs in these states (comma-separated): queued, running,
        /// done, failed, canceled; `active` (queued and running) and
        /// `finished` (done, failed, canceled).
        #[arg(long, value_delimiter = ',', value_parser = parse_states)]
        state: Vec<States>,
        /// Only jobs with this name; `*` and `?` match any characters
        /// (`--name 'sh0*'`).
        #[arg(long)]
        name: Option<String>,
        /// Only jobs submitted since then: a duration ago (`2h`, `30m`,
        /// `7d`) or a UTC time (`2026-12-01`, `2026-12-01T09:30:00Z`).
        #[arg(long, value_parser = parse_since)]
        since: Option<u64>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ticket: TicketArg,
    },
    /// Wait for jobs to finish, writing each frame as soon as it is
    /// stitched; exits 0 when every job is done, else with the code of the
    /// worst ending (see the README's exit codes).
    Wait {
        #[arg(required = true)]
        jobs: Vec<u64>,
        /// Download the frames here, each as soon as it is stitched.
        #[arg(long)]
        output: Option<PathBuf>,
        /// Replace files in --output that hold other frames (another
        /// job's, say); without it such a file is an error.
        #[arg(long)]
        overwrite: bool,
        /// With --output: also fetch the finished frames of a job that
        /// failed or was canceled.
        #[arg(long, requires = "output")]
        partial: bool,
        /// Give up after this long (e.g. 90s, 30m, 2h) with exit code 5;
        /// the jobs go on.
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<std::time::Duration>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ticket: TicketArg,
    },
    /// Show the failed attempts of a job (or of one task): each error and
    /// the renderer's log around it.
    Logs {
        job: u64,
        task: Option<u32>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ticket: TicketArg,
    },
    /// Put a failed job back in the queue: its finished tasks and frames
    /// stay, the failed and unfinished tasks are rendered again.
    Retry {
        job: u64,
        /// Then wait for it (as `wait`).
        #[arg(long)]
        wait: bool,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ticket: TicketArg,
    },
    /// Cancel a job.
    Cancel {
        job: u64,
        #[command(flatten)]
        ticket: TicketArg,
    },
    /// Rented nodes on demand: `fleet run` and `fleet plan` (README, "Fleet").
    Fleet {
        #[command(subcommand)]
        command: FleetCommand,
    },
    /// Blender builds shipped through the farm.
    Blender {
        #[command(subcommand)]
        command: BlenderCommand,
    },
    /// Remove stored assets and frames that no retained job uses (the
    /// coordinator also does this every hour).
    Gc {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ticket: TicketArg,
    },
    /// Stop handing out a job's tasks (running ones finish).
    Pause {
        job: u64,
        #[command(flatten)]
        ticket: TicketArg,
    },
    /// Resume a paused job.
    Resume {
        job: u64,
        #[command(flatten)]
        ticket: TicketArg,
    },
    /// Ask a worker to finish its tasks and leave (its process exits 0; at
    /// once when it is idle).
    Drain {
        /// The worker's name or id (see `tessera status`); a name drains
        /// every connected worker of that name.
        worker: String,
        #[command(flatten)]
        ticket: TicketArg,
    },
    /// Stream farm events (jobs, tasks, workers) as they happen, one line
    /// each; with --json one JSON object a line (NDJSON).
    Events {
        /// Only this job's events.
        #[arg(long)]
        job: Option<u64>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ticket: TicketArg,
    },
    /// Watch the farm live: workers, GPUs, jobs, tiles, cost; pause, cancel, drain.
    Monitor {
        #[command(flatten)]
        ticket: TicketArg,
    },
    /// Run a whole farm on this machine on a sample scene.
    Demo {
        #[arg(long, default_value_t = 3)]
        workers: u32,
        #[arg(long, default_value = "tessera-demo")]
        output: PathBuf,
        /// Split each frame into COLSxROWS tiles.
        #[arg(long, default_value = "4x4")]
        tiles: TileGrid,
        /// Use the builtin engine even when Blender is installed.
        #[arg(long)]
        builtin: bool,
    },
}

/// What a submit may upload besides the scene (see `share.rs`).
#[derive(clap::Args)]
struct ShareArgs {
    /// The project's folder: files the scene uses under it are
    /// uploaded (default: the scene's own folder).
    #[arg(long, value_name = "DIR")]
    project_root: Option<PathBuf>,
    /// A folder of shared assets whose files the scene may use and
    /// upload (repeat for several; also `TESSERA_ASSET_ROOTS`, a
    /// `:`-separated list, and `asset_roots` in the client config
    /// file). A file the scene uses outside the project and the asset
    /// roots is refused, naming it.
    #[arg(long = "asset-root", value_name = "DIR")]
    asset_roots: Vec<PathBuf>,
    /// Upload this one file the scene uses though it lies outside the
    /// project and the asset roots, or in a hidden folder of a home
    /// directory or another user's home (repeat for several).
    #[arg(long = "allow-file", value_name = "PATH")]
    allow_files: Vec<PathBuf>,
}

/// `submit X.uproject`: what Movie Render Queue renders, and how it splits.
#[derive(clap::Args)]
struct UnrealArgs {
    /// Unreal: the level sequence to render (/Game/...).
    #[arg(long)]
    level_sequence: Option<String>,
    /// Unreal: the map to load (/Game/...).
    #[arg(long)]
    map: Option<String>,
    /// Unreal: the Movie Render Queue preset (a MoviePipelinePrimaryConfig, /Game/...).
    #[arg(long)]
    mrq_config: Option<String>,
    /// Unreal: the sequence's shots (camera cuts), e.g. sh010=1-40,sh020=41-90;
    /// each is a task, or several with --chunk.
    #[arg(long)]
    shots: Option<String>,
    /// Unreal: frames per task (0: one task per shot).
    #[arg(long, default_value_t = 0)]
    chunk: u32,
    /// Unreal: frames rendered and thrown away before a chunk that starts
    /// inside a shot, so its first frame has a continuous render's history.
    #[arg(long, default_value_t = 8)]
    warm_up: u32,
    /// Unreal: the image format the preset writes (png or exr).
    #[arg(long, value_parser = parse_mrq_format)]
    mrq_format: Option<tessera_protocol::job::OutputFormat>,
    /// Unreal: the preset's File Name Format (default MRQ's own,
    /// {sequence_name}.{frame_number}).
    #[arg(long)]
    mrq_file_name_format: Option<String>,
    /// Unreal: the preset's Zero Pad Frame Numbers (default 4).
    #[arg(long)]
    mrq_zero_pad: Option<u32>,
    /// Unreal: the output resolution, WxH (default 1920x1080).
    #[arg(long, value_parser = parse_resolution)]
    resolution: Option<(u32, u32)>,
}

/// `--after JOB[,JOB...]`.
#[derive(Clone)]
struct AfterArg(Vec<u64>);

fn parse_after(s: &str) -> Result<AfterArg, String> {
    tessera_protocol::job::parse_after(s).map(AfterArg)
}

fn parse_after_failure(s: &str) -> Result<tessera_protocol::job::AfterFailure, String> {
    s.parse()
}

fn parse_mrq_format(s: &str) -> Result<tessera_protocol::job::OutputFormat, String> {
    match s.to_ascii_lowercase().as_str() {
        "png" => Ok(tessera_protocol::job::OutputFormat::Png),
        "exr" => Ok(tessera_protocol::job::OutputFormat::Exr),
        _ => Err(format!("`{s}`: Tessera collects png or exr frames")),
    }
}

fn parse_resolution(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("`{s}` is not a resolution: expected WxH, e.g. 1920x1080");
    let (w, h) = s.split_once(['x', 'X']).ok_or_else(bad)?;
    Ok((w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?))
}

/// What a client does to workers besides rendering with them.
#[derive(Subcommand)]
enum WorkerAdmin {
    /// Cut off every worker enrolled as NAME: disconnected now, refused from
    /// then on (also after a restart). Rotate the tickets too if the
    /// machine itself is no longer trusted.
    Revoke {
        name: String,
        #[command(flatten)]
        ticket: TicketArg,
    },
}

/// What is done to a coordinator besides running it.
#[derive(Subcommand)]
enum CoordinatorAdmin {
    /// Copy the data dir (database, blobs, identity, tickets) into DEST,
    /// consistently, while the coordinator runs; start a coordinator with
    /// `--data-dir DEST` to restore it.
    Backup {
        /// The running coordinator's data dir.
        #[arg(long)]
        data_dir: PathBuf,
        /// A new (or empty) folder.
        dest: PathBuf,
    },
    /// Issue new worker and client tickets on the running coordinator: the
    /// old ones are refused for new connections from now on; enrolled
    /// workers keep working with their own credentials.
    RotateTickets {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ticket: TicketArg,
    },
}

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Every control character a log line holds is written as an escape: a
    // worker's or a job's name (chosen by a rented machine or a client)
    // must not forge log lines or reach a terminal as an escape sequence.
    // So no colours either.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| EscapingWriter(std::io::stderr()))
        .with_ansi(false)
        .with_target(false)
        .init();
}

/// Writes each log record with its control characters escaped, its final
/// newline kept (the formatter writes one record per call).
struct EscapingWriter<W>(W);

impl<W: std::io::Write> std::io::Write for EscapingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let (body, newline) = match buf.split_last() {
            Some((b'\n', body)) => (body, true),
            _ => (buf, false),
        };
        let text = String::from_utf8_lossy(body);
        let mut line = tessera_protocol::text::escape_controls(&text).into_owned();
        if newline {
            line.push('\n');
        }
        self.0.write_all(line.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

fn main() {
    let cli = Cli::parse();
    let server = matches!(
        cli.command,
        Command::Coordinator { admin: None, .. } | Command::Worker { admin: None, .. }
    );
    // The monitor owns the terminal: log lines would scribble over it.
    let monitor = matches!(cli.command, Command::Monitor { .. });
    // A client command whose output is piped into `head` ends quietly (exit
    // 141, as other Unix tools do) when the pipe closes, instead of
    // panicking in println!. Not for processes that write to their
    // children's pipes (coordinator, worker, demo, fleet), where a closed
    // pipe is an error to handle.
    let owns_children = server
        || matches!(
            cli.command,
            Command::Demo { .. } | Command::Fleet { .. } | Command::Monitor { .. }
        );
    if !owns_children {
        // SAFETY: restoring a signal's default disposition at start, before
        // any thread exists.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    init_logging(match (server, monitor) {
        (true, _) => "info",
        (_, true) => "off",
        _ => "warn",
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // The coordinator counts blocking calls made on these threads.
        .on_thread_park(tessera_coordinator::watch::runtime_thread)
        .on_thread_unpark(tessera_coordinator::watch::runtime_thread)
        .build()
        .expect("tokio runtime");
    let ran = runtime.block_on(async {
        let ran = run(cli.command).await;
        client::close_all().await;
        ran
    });
    match ran {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            // One line: the reason, with its causes.
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            std::process::exit(exit::for_error(&e));
        }
    }
}

pub(crate) async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("signal handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

async fn run(command: Command) -> anyhow::Result<i32> {
    match command {
        Command::Coordinator {
            admin: Some(CoordinatorAdmin::Backup { data_dir, dest }),
            ..
        } => {
            let copied = tessera_coordinator::backup::backup(&data_dir, &dest)?;
            println!(
                "backed up {} into {}: the database and {} blob files ({} bytes)",
                data_dir.display(),
                dest.display(),
                copied.blobs,
                copied.bytes
            );
            Ok(0)
        }
        Command::Coordinator {
            admin: Some(CoordinatorAdmin::RotateTickets { json, ticket }),
            ..
        } => {
            let ticket = client::resolve_ticket(ticket.ticket.as_deref())?;
            let mut client = Client::connect(&ticket).await?;
            let (worker, client_ticket) = client.rotate_tickets().await?;
            if json {
                let tickets = serde_json::json!({ "worker": worker, "client": client_ticket });
                println!("{tickets}");
            } else {
                println!("worker ticket: {worker}\nclient ticket: {client_ticket}");
                eprintln!("the old tickets are refused from now on; the data dir's ticket files hold the new ones");
            }
            Ok(0)
        }
        Command::Worker {
            admin: Some(WorkerAdmin::Revoke { name, ticket }),
            ..
        } => {
            let ticket = client::resolve_ticket(ticket.ticket.as_deref())?;
            let mut client = Client::connect(&ticket).await?;
            let (identities, disconnected) = client.revoke_worker(&name).await?;
            println!(
                "revoked worker {name} ({identities} identities, {disconnected} connections closed): it may not join again"
            );
            Ok(0)
        }
        Command::Coordinator {
            admin: None,
            data_dir,
            listen,
            advertise,
            heartbeat_ms,
            lease_ms,
            no_cache_affinity,
            no_pipelining,
            congestion,
            retention,
            scrub_mb_per_sec,
            task_timeout,
            http,
            webhook,
            webhook_secret_file,
            webhook_backoff_ms,
            webhook_max_backoff_ms,
        } => {
            // Required by clap unless a subcommand is given.
            let data_dir = data_dir.context("pass --data-dir")?;
            let mut config = tessera_coordinator::server::Config::new(data_dir.clone(), listen);
            config.scrub_bytes_per_sec = (scrub_mb_per_sec.max(0.0) * 1e6) as u64;
            config.advertise = advertise;
            config.heartbeat_ms = heartbeat_ms;
            config.lease_ms = lease_ms.max(heartbeat_ms);
            config.cache_affinity = !no_cache_affinity;
            config.pipelining = !no_pipelining;
            tessera_coordinator::use_congestion(congestion);
            config.retention = retention;
            config.task_timeout = task_timeout.filter(|t| !t.is_zero());
            config.http = match http.as_deref() {
                None => None,
                Some("ticket") => Some(HttpListen::SamePort),
                Some(addr) => Some(HttpListen::Addr(addr.parse().with_context(|| {
                    format!("--http {addr}: expected HOST:PORT, e.g. 127.0.0.1:7701")
                })?)),
            };
            if let Some(url) = webhook {
                tessera_coordinator::webhook::parse_url(&url)?;
                let secret = match webhook_secret_file {
                    Some(file) => std::fs::read(&file)
                        .with_context(|| format!("cannot read {}", file.display()))?,
                    None => std::env::var("TESSERA_WEBHOOK_SECRET")
                        .map(String::into_bytes)
                        .map_err(|_| {
                            anyhow::anyhow!("--webhook needs a signing secret: pass --webhook-secret-file FILE or set TESSERA_WEBHOOK_SECRET")
                        })?,
                };
                let secret = String::from_utf8_lossy(&secret).trim().as_bytes().to_vec();
                if secret.is_empty() {
                    anyhow::bail!("the webhook's signing secret is empty");
                }
                config.webhook = Some(Webhook {
                    url,
                    secret,
                    first_backoff: std::time::Duration::from_millis(webhook_backoff_ms.max(1)),
                    max_backoff: std::time::Duration::from_millis(
                        webhook_max_backoff_ms.max(webhook_backoff_ms),
                    ),
                });
            }
            let coordinator = tessera_coordinator::server::start(config).await?;
            // Scripts read the first line to learn the address; a closed
            // stdout must not stop the coordinator.
            let mut banner = format!(
                "tessera coordinator listening on {}\nworker ticket: {}\nclient ticket: {}\n",
                coordinator.addr,
                data_dir.join("worker.ticket").display(),
                data_dir.join("client.ticket").display()
            );
            if coordinator.http_addr.is_some() {
                let url = std::fs::read_to_string(data_dir.join("http.url")).unwrap_or_default();
                banner += &format!("http api: {}\n", url.trim());
            }
            let mut stdout = std::io::stdout();
            let _ = stdout
                .write_all(banner.as_bytes())
                .and_then(|()| stdout.flush());
            coordinator.run_until(shutdown_signal()).await;
            Ok(0)
        }
        Command::Worker {
            admin: None,
            ticket,
            name,
            cache_dir,
            cache_max,
            engine,
            slots,
            threads,
            price_per_hour,
            blender_device,
            blenders,
            blender_python,
            build_python,
            blender_cold,
            drain_grace,
            stall_window,
            session_idle,
            noop_ms,
            interruptible,
            unreal_editor,
            congestion,
            exit_after_idle,
        } => {
            tessera_worker::use_congestion(congestion);
            // Required by clap unless a subcommand is given.
            let ticket = client::resolve_ticket(Some(&ticket.context("pass --ticket")?))?;
            if ticket.role != tessera_protocol::messages::Role::Worker {
                anyhow::bail!(
                    "this is a client ticket; a worker joins with DATA_DIR/worker.ticket"
                );
            }
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let slots = match slots {
                Slots::Count(n) => n.max(1),
                Slots::Auto => match tessera_worker::telemetry::gpu_count() {
                    Ok(n) if n > 0 => n.min(MAX_SLOTS),
                    found => {
                        let why = found.err().unwrap_or_else(|| "NVML finds no GPU".into());
                        tracing::info!("--slots auto: {why}; one slot per CPU core");
                        (cores as u32).clamp(1, MAX_SLOTS)
                    }
                },
            };
            let threads = threads.unwrap_or((cores / slots as usize).max(1));
            let auto = blenders.iter().any(|b| b.as_os_str() == "auto");
            let blenders: Vec<PathBuf> = (blenders.into_iter())
                .filter(|b| b.as_os_str() != "auto")
                .collect();
            // Held for the life of the process: the default cache folder
            // (and the identity in it) belongs to one worker at a time.
            let mut _cache_lock = None;
            let (name, cache_dir) = match (name, cache_dir) {
                (Some(name), Some(dir)) => (name, dir),
                (Some(name), None) => {
                    let dir = default_cache_dir(&name);
                    (name, dir)
                }
                (None, Some(dir)) => (host_name(), dir),
                (None, None) => {
                    let (name, dir, lock) = default_worker_name()?;
                    _cache_lock = Some(lock);
                    (name, dir)
                }
            };
            // Absolute from here on: renderers are marked with it (a
            // sweep compares it) and their HOME is under it.
            std::fs::create_dir_all(&cache_dir).with_context(|| {
                format!("cannot create the cache folder {}", cache_dir.display())
            })?;
            let cache_dir = std::fs::canonicalize(&cache_dir)
                .with_context(|| format!("cannot use the cache folder {}", cache_dir.display()))?;
            // Before any Blender starts (the probes below): end what an
            // earlier run on this cache folder left running, and keep pid
            // files of what this one starts.
            tessera_worker::child::set_cache_dir(&cache_dir)
                .with_context(|| format!("cannot use the cache folder {}", cache_dir.display()))?;
            let swept = tessera_worker::child::sweep(&cache_dir);
            if swept > 0 {
                tracing::warn!(
                    swept,
                    "ended renderers an earlier run of this worker left running"
                );
            }
            let unreal = unreal_editor.map(|editor| {
                Arc::new(engine::unreal::Unreal::new(
                    editor, &cache_dir, cache_max, slots,
                )) as Arc<dyn engine::Engine>
            });
            let (engines, blender_engine) = worker_engines(EngineChoice {
                unreal,
                choice: &engine,
                threads,
                slots,
                blender_device: blender_device.0,
                blenders: &blenders,
                blender_python: &blender_python,
                blender_cold,
                noop_ms,
                auto,
            })?;
            let builds = match (auto, blender_engine) {
                (true, Some(b)) => Some(Arc::new(tessera_worker::builds::AutoBuilds::new(
                    build_python,
                    b,
                ))),
                (true, None) => anyhow::bail!(
                    "--blender auto needs the blender engine (--engine auto or blender)"
                ),
                (false, _) => None,
            };
            let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
            tokio::spawn(async move {
                shutdown_signal().await;
                let _ = stop_tx.send(true);
            });
            let config = tessera_worker::run::Config {
                ticket,
                name,
                cache_dir,
                cache_max,
                engines,
                slots,
                price_per_hour,
                drain_grace,
                interruptible,
                builds,
                stall_window,
                session_idle: (!session_idle.is_zero()).then_some(session_idle),
                exit_after_idle: exit_after_idle.filter(|d| !d.is_zero()),
            };
            tessera_worker::run::run(config, stop_rx).await?;
            Ok(0)
        }
        Command::Submit {
            scene,
            frames,
            tiles,
            sample_ranges,
            samples,
            verify,
            deadline,
            budget_usd,
            on_budget,
            task_timeout,
            output,
            overwrite,
            partial,
            timeout,
            name,
            priority,
            wait,
            json,
            upload_only,
            request_id,
            after,
            after_failure,
            paused,
            frame_files,
            job_params,
            allow_missing,
            share,
            engine,
            blender,
            blender_python,
            frame_names,
            unreal,
            ticket,
        } => {
            if !wait && (output.is_some() || timeout.is_some()) {
                let what = if output.is_some() {
                    "--output"
                } else {
                    "--timeout"
                };
                return Err(exit::usage(format!(
                    "{what} needs --wait (submit returns at once without it; use `tessera wait JOB {what} …` later)"
                )));
            }
            let ticket = client::resolve_ticket(ticket.ticket.as_deref())?;
            let opts = SubmitOptions {
                scene,
                frames,
                tiles,
                sample_ranges,
                samples,
                verify,
                deadline,
                budget: budget_usd.map(|usd| tessera_protocol::job::Budget {
                    usd,
                    on_reached: on_budget,
                }),
                task_timeout,
                name,
                priority,
                request_id,
                engine,
                allow_missing,
                builtin_frame_names: frame_names == "frame",
                progress: !json,
                blender,
                blender_python,
                unreal: uproject::UnrealOptions {
                    level_sequence: unreal.level_sequence,
                    map: unreal.map,
                    mrq_config: unreal.mrq_config,
                    shots: unreal.shots,
                    chunk: unreal.chunk,
                    warm_up: unreal.warm_up,
                    format: unreal.mrq_format,
                    file_name_format: unreal.mrq_file_name_format,
                    zero_pad: unreal.mrq_zero_pad,
                    resolution: unreal.resolution,
                },
                after: after.map(|a| a.0).unwrap_or_default(),
                after_failure,
                paused,
                frame_files,
                share: share::ShareOptions {
                    project_root: share.project_root,
                    asset_roots: (share.asset_roots.into_iter())
                        .map(|r| (r, "--asset-root".to_string()))
                        .collect(),
                    allow_files: share.allow_files,
                }
                .with_studio_roots()?,
            };
            if openjd::is_template(&opts.scene) {
                let template = openjd::load(&opts.scene, &job_params)?;
                let mut client = Client::connect(&ticket).await?;
                let wait_opts = follow::WaitOptions {
                    output: output.map(|dir| (dir, overwrite)),
                    partial,
                    timeout,
                    progress: !json,
                };
                return submit_template(
                    &ticket,
                    &mut client,
                    template,
                    opts,
                    wait,
                    wait_opts,
                    json,
                )
                .await;
            }
            if !job_params.is_empty() {
                anyhow::bail!(
                    "--job-param is for Open Job Description templates (.yaml); this is a scene"
                );
            }
            let mut client = Client::connect(&ticket).await?;
            if upload_only {
                let (spec, _warnings, _from) = client::upload_scene(&mut client, &opts).await?;
                println!("{}", serde_json::to_string(&spec)?);
                return Ok(0);
            }
            let client::Submitted {
                status,
                warnings,
                files,
            } = client::submit(&mut client, &opts).await?;
            if !wait {
                report::print_submitted(&status, &warnings, &files, json);
                return Ok(0);
            }
            if !json {
                eprintln!(
                    "job {} submitted: {}",
                    status.id,
                    report::summary_line(&status)
                );
            }
            let opts = follow::WaitOptions {
                output: output.map(|dir| (dir, overwrite)),
                partial,
                timeout,
                progress: !json,
            };
            finish_wait(&ticket, client, &[status.id], &opts, json, Some(&warnings)).await
        }
        Command::Status {
            jobs: ids,
            state,
            name,
            since,
            json,
            ticket,
        } => {
            let ticket = client::resolve_ticket(ticket.ticket.as_deref())?;
            let mut client = Client::connect(&ticket).await?;
            let mut states: Vec<JobState> = state.into_iter().flat_map(|s| s.0).collect();
            states.sort_by_key(|s| *s as u8);
            states.dedup();
            let filter = JobFilter {
                states,
                name,
                since_unix_ms: since,
                ids: ids.clone(),
            };
            let only_ids = JobFilter {
                ids: ids.clone(),
                ..Default::default()
            };
            if let ([id], true) = (&ids[..], filter == only_ids) {
                report::print_detail(&client.job_detail(*id).await?, json);
                return Ok(0);
            }
            let jobs = client.jobs(&filter).await?;
            let workers = client.workers().await?;
            report::print_status(None, &jobs, &workers, json);
            Ok(0)
        }
        Command::Wait {
            jobs,
            output,
            overwrite,
            partial,
            timeout,
            json,
            ticket,
        } => {
            let ticket = client::resolve_ticket(ticket.ticket.as_deref())?;
            let client = Client::connect(&ticket).await?;
            let opts = follow::WaitOptions {
                output: output.map(|dir| (dir, overwrite)),
                partial,
                timeout,
                progress: !json,
            };
            let mut jobs = jobs;
            let mut seen = std::collections::HashSet::new();
            jobs.retain(|j| seen.insert(*j));
            finish_wait(&ticket, client, &jobs, &opts, json, None).await
        }
        Command::Events { job, json, ticket } => {
            let ticket = client::resolve_ticket(ticket.ticket.as_deref())?;
            let client = Client::connect(&ticket).await?;
            report::stream_events(client.subscribe().await?, job, json).await
        }
        Command::Pause { job, ticket } => pause(job, ticket, true).await,
        Command::Resume { job, ticket } => pause(job, ticket, false).await,
        Command::Fleet { command } => match command {
            FleetCommand::Run {
                config,
                status_file,
                tick_ms,
                ticket,
            } => {
                let ticket = client::resolve_ticket(ticket.ticket.as_deref())?;
                let mut client = Client::connect(&ticket).await?;
                let tick = std::time::Duration::from_millis(tick_ms.clamp(50, 60_000));
                fleet::run(&config, &mut client, status_file.as_deref(), Some(tick)).await
            }
            FleetCommand::Plan {
                config,
                json,
                ticket,
            } => {
                let ticket = client::resolve_ticket(ticket.ticket.as_deref())?;
                let mut client = Client::connect(&ticket).await?;
                fleet::plan(&config, &mut client, json).await
            }
        },
        Command::Drain { worker, ticket } => {
            let ticket = client::resolve_ticket(ticket.ticket.as_deref())?;
            let mut client = Client::connect(&ticket).await?;
            let workers = client.workers().await?;
            let ids: Vec<(u64, String)> = match worker.parse::<u64>() {
                Ok(id) if !workers.iter().any(|w| w.name == worker) => {
                    vec![(id, format!("{id}"))]
                }
                _ => (workers.iter())
                    .filter(|w| w.name == worker)
                    .map(|w| (w.id, format!("{} (id {})", shown::text(&w.name), w.id)))
                    .collect(),
            };
            if ids.is_empty() {
                let names: Vec<String> = workers.iter().map(|w| shown::text(&w.name)).collect();
                anyhow::bail!(
                    "no connected worker is named `{}` (connected: {})",
                    shown::text(&worker),
                    if names.is_empty() {
                        "none".into()
                    } else {
                        names.join(", ")
                    }
                );
            }
            for (id, shown) in ids {
                client.drain(id).await?;
                println!("worker {shown} is draining: it finishes its tasks, then leaves");
            }
            Ok(0)
        }
        Command::Logs {
            job,
            task,
            json,
            ticket,
        } => {
            let ticket = client::resolve_ticket(ticket.ticket.as_deref())?;
            let mut client = Client::connect(&ticket).await?;
            let logs = client.logs(job, task).await?;
            report::print_logs(job, &logs, json);
            Ok(0)
        }
        Command::Retry {
            job,
            wait,
            json,
            ticket,
        } => {
            let ticket = client::resolve_ticket(ticket.ticket.as_deref())?;
            let mut client = Client::connect(&ticket).await?;
            let status = client.retry(job).await?;
            if !wait {
                if json {
                    println!("{}", report::job_json(&status));
                } else {
                    println!(
                        "job {job} is {} again: {}",
                        status.state.name(),
                        follow::progress_line(&status)
                    );
                }
                return Ok(0);
            }
            let opts = follow::WaitOptions {
                output: None,
                partial: false,
                timeout: None,
                progress: !json,
            };
            finish_wait(&ticket, client, &[job], &opts, json, None).await
        }
        Command::Cancel { job, ticket } => {
            let ticket = client::resolve_ticket(ticket.ticket.as_deref())?;
            let mut client = Client::connect(&ticket).await?;
            let status = client.cancel(job).await?;
            println!("job {} is {}", status.id, status.state.name());
            Ok(0)
        }
        Command::Blender { command } => blender_command(command).await,
        Command::Gc { json, ticket } => {
            let ticket = client::resolve_ticket(ticket.ticket.as_deref())?;
            let mut client = Client::connect(&ticket).await?;
            let c = client.collect_garbage().await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "removed_blobs": c.removed_blobs,
                        "removed_bytes": c.removed_bytes,
                        "kept_blobs": c.kept_blobs,
                        "kept_bytes": c.kept_bytes,
                    })
                );
            } else {
                println!(
                    "removed {} blobs ({}), kept {} ({})",
                    c.removed_blobs,
                    progress::human_bytes(c.removed_bytes),
                    c.kept_blobs,
                    progress::human_bytes(c.kept_bytes)
                );
            }
            Ok(0)
        }
        Command::Monitor { ticket } => {
            let ticket = client::resolve_ticket(ticket.ticket.as_deref())?;
            monitor::run(ticket).await?;
            Ok(0)
        }
        Command::Demo {
            workers,
            output,
            tiles,
            builtin,
        } => demo::run(workers.max(1), &output, tiles, builtin).await,
    }
}

async fn pause(job: u64, ticket: TicketArg, paused: bool) -> anyhow::Result<i32> {
    let ticket = client::resolve_ticket(ticket.ticket.as_deref())?;
    let mut client = Client::connect(&ticket).await?;
    client.pause(job, paused).await?;
    println!("job {job} {}", if paused { "paused" } else { "resumed" });
    Ok(0)
}

/// `submit TEMPLATE.yaml`: one job per step of an Open Job Description
/// template, each `--after` the steps it depends on (and the command
/// line's `--after`, for the steps that depend on none); with `--wait`,
/// waits for each and downloads its frames (into `--output`, or a folder
/// per step when there are several).
async fn submit_template(
    ticket: &tessera_protocol::ticket::Ticket,
    client: &mut Client,
    template: openjd::Imported,
    opts: SubmitOptions,
    wait: bool,
    wait_opts: follow::WaitOptions,
    json: bool,
) -> anyhow::Result<i32> {
    let output = wait_opts.output.clone();
    for note in &template.notes {
        eprintln!("note: {note}");
    }
    let several = template.steps.len() > 1;
    let base_name = opts.name.clone().unwrap_or_else(|| template.name.clone());
    let mut jobs: Vec<(String, u64)> = Vec::new();
    let mut printed = Vec::new();
    for step in &template.steps {
        let mut after: Vec<u64> = step.after.iter().map(|&i| jobs[i].1).collect();
        if step.after.is_empty() {
            after.extend(&opts.after);
        }
        let mut step_opts = opts.clone();
        step_opts.scene = step.scene.clone();
        step_opts.frames = step.frames.clone().or_else(|| opts.frames.clone());
        step_opts.name = Some(if several {
            format!("{base_name} / {}", step.name)
        } else {
            base_name.clone()
        });
        step_opts.request_id = (opts.request_id.as_ref()).map(|r| format!("{r}/{}", step.name));
        step_opts.after = after;
        let client::Submitted {
            status, warnings, ..
        } = client::submit(client, &step_opts)
            .await
            .with_context(|| format!("step {} of the template", step.name))?;
        if json {
            let mut v = report::job_json(&status);
            v["step"] = serde_json::json!(step.name);
            v["warnings"] = serde_json::json!(warnings);
            printed.push(v);
        } else {
            println!(
                "job {} submitted for step {}: {}",
                status.id,
                step.name,
                report::summary_line(&status)
            );
        }
        jobs.push((step.name.clone(), status.id));
    }
    if json && !wait {
        println!(
            "{}",
            serde_json::json!({ "template": template.name, "jobs": printed })
        );
    }
    if !wait {
        return Ok(0);
    }
    let mut code = 0;
    for (name, id) in &jobs {
        let out = output.as_ref().map(|(dir, o)| {
            let dir = if several { dir.join(name) } else { dir.clone() };
            (dir, *o)
        });
        let opts = follow::WaitOptions {
            output: out,
            ..wait_opts.clone()
        };
        let waited = follow::wait(ticket, None, &[*id], &opts).await?;
        report::print_waited(&waited, None, json, opts.timeout);
        let c = waited.exit_code();
        if code == 0 {
            code = c;
        }
    }
    Ok(code)
}

/// Follows `jobs` to their end and prints how each ended (one JSON
/// object with `--json`: the job's, or `{"jobs": [...]}` for several).
async fn finish_wait(
    ticket: &tessera_protocol::ticket::Ticket,
    client: Client,
    jobs: &[u64],
    opts: &follow::WaitOptions,
    json: bool,
    warnings: Option<&[String]>,
) -> anyhow::Result<i32> {
    let waited = follow::wait(ticket, Some(client), jobs, opts).await?;
    report::print_waited(&waited, warnings, json, opts.timeout);
    Ok(waited.exit_code())
}

/// One `--state` value: a state, or a name for several.
#[derive(Debug, Clone)]
struct States(Vec<JobState>);

fn parse_states(s: &str) -> Result<States, String> {
    use JobState::*;
    Ok(States(match s.trim().to_ascii_lowercase().as_str() {
        "queued" => vec![Queued],
        "running" => vec![Running],
        "done" => vec![Done],
        "failed" => vec![Failed],
        "canceled" | "cancelled" => vec![Canceled],
        "active" => vec![Queued, Running],
        "finished" => vec![Done, Failed, Canceled],
        other => {
            return Err(format!(
                "`{other}` is not a job state: queued, running, done, failed, canceled, active or finished"
            ))
        }
    }))
}

/// `--since`: a duration ago (`2h`) or a UTC date or time
/// (`2026-12-01`, `2026-12-01T09:30`, `2026-12-01T09:30:00Z`, with an
/// optional `+HH:MM` offset); unix milliseconds.
fn parse_since(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    if t.len() < 10 || t.as_bytes().get(4) != Some(&b'-') {
        let ago = parse_duration(t).map_err(|_| {
            format!(
                "`{text}`: give a duration ago (2h, 30m, 7d) or a UTC time (2026-12-01T09:30:00Z)"
            )
        })?;
        return Ok(now.saturating_sub(ago.as_millis() as u64));
    }
    parse_utc(t).ok_or_else(|| {
        format!(
            "`{text}` is not a time: expected 2026-12-01, 2026-12-01T09:30 or 2026-12-01T09:30:00Z"
        )
    })
}

/// An ISO 8601 date or date-time in UTC (or with an offset), as unix ms.
fn parse_utc(t: &str) -> Option<u64> {
    let num = |s: &str| -> Option<i64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok())?
    };
    let (date, rest) = t.split_at(10);
    let mut d = date.split('-');
    let (y, m, day) = (num(d.next()?)?, num(d.next()?)?, num(d.next()?)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || y < 1970 {
        return None;
    }
    let mut secs = 0i64;
    let mut offset = 0i64;
    if let Some(time) = rest.strip_prefix(['T', 't', ' ']) {
        let (clock, zone) = match time.find(['Z', 'z', '+', '-']) {
            Some(i) => time.split_at(i),
            None => (time, ""),
        };
        let mut parts = clock.split(':');
        let h = num(parts.next()?)?;
        let min = num(parts.next()?)?;
        let sec = match parts.next() {
            Some(s) => num(s.split('.').next()?)?,
            None => 0,
        };
        if parts.next().is_some() || h > 23 || min > 59 || sec > 60 {
            return None;
        }
        secs = h * 3600 + min * 60 + sec;
        if let Some(z) = zone
            .strip_prefix('+')
            .map(|z| (1, z))
            .or(zone.strip_prefix('-').map(|z| (-1, z)))
        {
            let (sign, z) = z;
            let (oh, om) = z.split_once(':').unwrap_or((z.get(..2)?, z.get(2..)?));
            offset = sign * (num(oh)? * 3600 + num(om)? * 60);
        } else if !matches!(zone, "" | "Z" | "z") {
            return None;
        }
    } else if !rest.is_empty() {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let unix = days * 86_400 + secs - offset;
    u64::try_from(unix).ok().map(|s| s * 1000)
}

/// A duration such as `7d`, `12h`, `30m` or `45s`.
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let t = text.trim();
    if t == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    let unit = match t.chars().last() {
        Some('d') => 86_400.0,
        Some('h') => 3_600.0,
        Some('m') => 60.0,
        Some('s') => 1.0,
        _ => return Err(format!("`{text}`: give a unit, e.g. 7d, 12h, 30m or 45s")),
    };
    let n: f64 = t[..t.len() - 1]
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (e.g. 7d, 12h, 30m or 45s)"))?;
    if n.is_nan() || n < 0.0 || n.is_infinite() {
        return Err(format!("`{text}`: the duration must be 0 or more"));
    }
    std::time::Duration::try_from_secs_f64(n * unit)
        .map_err(|_| format!("`{text}` is too long a duration"))
}

/// Seconds (`90`, `2.5`) or a duration with its unit (`90s`, `5m`).
fn parse_seconds(text: &str) -> Result<std::time::Duration, String> {
    match text.trim().parse::<f64>() {
        Ok(n) if n.is_finite() && n >= 0.0 => std::time::Duration::try_from_secs_f64(n)
            .map_err(|_| format!("`{text}` is too long a duration")),
        Ok(_) => Err(format!("`{text}`: give 0 or more seconds")),
        Err(_) => parse_duration(text),
    }
}

/// A size such as `50G`, `800M`, `64K` (powers of 1024) or plain bytes.
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let mult = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("`{text}`: unknown size unit (use K, M, G or T)")),
            };
            (&t[..i], mult)
        }
        _ => (t, 1),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a size (e.g. 50G, 800M or bytes)"))?;
    if n.is_nan() || n < 1.0 || n.is_infinite() {
        return Err(format!("`{text}`: the size must be at least 1 byte"));
    }
    Ok((n * mult as f64) as u64)
}

async fn blender_command(command: BlenderCommand) -> anyhow::Result<i32> {
    match command {
        BlenderCommand::Add { path, json, ticket } => {
            let ticket = client::resolve_ticket(ticket.ticket.as_deref())?;
            let mut client = Client::connect(&ticket).await?;
            let added =
                build::add(&mut client, &path, !json && std::io::stderr().is_terminal()).await?;
            report::print_build_added(&added, json);
        }
        BlenderCommand::List { json, ticket } => {
            let ticket = client::resolve_ticket(ticket.ticket.as_deref())?;
            let mut client = Client::connect(&ticket).await?;
            report::print_builds(&build::list(&mut client).await?, json);
        }
    }
    Ok(0)
}

/// What a worker offers for `--engine`.
struct EngineChoice<'a> {
    choice: &'a str,
    threads: usize,
    slots: u32,
    /// `None`: auto.
    blender_device: Option<blender::Device>,
    blenders: &'a [PathBuf],
    blender_python: &'a [PathBuf],
    blender_cold: bool,
    noop_ms: u64,
    /// `--blender auto`: offer the stored builds, even with no Blender here.
    auto: bool,
    /// `--unreal-editor`: Movie Render Queue through this Unreal.
    unreal: Option<Arc<dyn engine::Engine>>,
}

/// `--price-per-hour`: finite and at least 0 (NaN, inf and negative
/// prices are refused here and by the coordinator).
fn parse_price(s: &str) -> Result<f64, String> {
    let price: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    tessera_protocol::messages::check_price(price)?;
    Ok(price)
}

#[derive(Debug, Clone, Copy)]
enum Slots {
    Count(u32),
    Auto,
}

fn parse_slots(s: &str) -> Result<Slots, String> {
    match s {
        "auto" => Ok(Slots::Auto),
        n => match n.parse::<u32>() {
            Ok(k) if (1..=MAX_SLOTS).contains(&k) => Ok(Slots::Count(k)),
            _ => Err(format!(
                "`{n}` is not `auto` or a slot count from 1 to {MAX_SLOTS}"
            )),
        },
    }
}

/// `--blender-device`: `auto` or a device.
#[derive(Debug, Clone, Copy)]
struct DeviceArg(Option<blender::Device>);

fn parse_device(s: &str) -> Result<DeviceArg, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(DeviceArg(None));
    }
    s.parse().map(|d| DeviceArg(Some(d)))
}

/// Probes every Blender the worker was told about (or finds one), in
/// parallel. Blenders named on the command line must work; one found on the
/// PATH is skipped with a note when it does not.
fn blender_installs(c: &EngineChoice<'_>) -> anyhow::Result<Vec<blender_runtime::Installed>> {
    use blender_runtime::Runtime;
    let mut named: Vec<Runtime> = c.blenders.iter().map(|p| Runtime::executable(p)).collect();
    named.extend(c.blender_python.iter().cloned().map(Runtime::Module));
    let found = named.is_empty();
    if found && c.auto {
        // Only what `--blender auto` fetches, unless others are named.
        return Ok(Vec::new());
    }
    if found {
        match blender::detect() {
            Some((exe, _)) => named.push(Runtime::Executable(exe)),
            None => return Ok(Vec::new()),
        }
    }
    // Each GPU slot's probe runs as that slot's sessions will, seeing only
    // its own GPU; the first slot's answer is what the worker offers.
    let probe_all = |device: Option<blender::Device>| {
        let envs = device.map_or(vec![Vec::new()], |d| d.probe_envs(c.slots));
        std::thread::scope(|s| {
            let handles: Vec<Vec<_>> = named
                .iter()
                .map(|r| {
                    envs.iter()
                        .map(|env| {
                            s.spawn(move || {
                                let dev = device.map_or("CPU", blender::Device::name);
                                blender_runtime::probe_pinned(r, dev, env)
                            })
                        })
                        .collect()
                })
                .collect();
            handles
                .into_iter()
                .map(|slots| {
                    let mut results = slots
                        .into_iter()
                        .map(|h| h.join().expect("probe thread"))
                        .enumerate();
                    let (_, first) = results.next().expect("one probe at least");
                    let failed = results.find_map(|(slot, r)| {
                        r.err().map(|e| {
                            e.context(format!("slot {slot}'s GPU {slot} failed its probe"))
                        })
                    });
                    match failed {
                        Some(e) => Err(e),
                        None => first,
                    }
                })
                .collect::<Vec<_>>()
        })
    };
    // `auto` asks Cycles what it finds first, then probes that device.
    let device = match c.blender_device {
        Some(d) => Some(d),
        None => {
            let first = probe_all(None);
            let devices: Vec<String> = first
                .iter()
                .flatten()
                .flat_map(|i| i.offer.devices.clone())
                .collect();
            let pick = blender_runtime::auto_device(&devices);
            tracing::info!(device = pick, "--blender-device auto");
            Some(pick.parse().expect("a known device"))
        }
    };
    let mut installs = Vec::new();
    for (runtime, result) in named.iter().zip(probe_all(device)) {
        match result {
            Ok(i) => {
                tracing::info!(
                    blender = %i.offer.name,
                    path = %runtime.path().display(),
                    device = %i.offer.render_device,
                    oidn = i.offer.oidn,
                    osl = i.offer.osl,
                    eevee = i.offer.eevee,
                    "blender found"
                );
                installs.push(i);
            }
            Err(e) if found => {
                tracing::info!("{e:#}; not offering the blender engine");
            }
            Err(e) => return Err(e.context("a Blender named on the command line does not work")),
        }
    }
    Ok(installs)
}

/// The engines a worker offers, and its Blender engine (for `--blender auto`).
type Engines = (Vec<Arc<dyn engine::Engine>>, Option<Arc<blender::Blender>>);

fn worker_engines(c: EngineChoice<'_>) -> anyhow::Result<Engines> {
    let builtin = || Arc::new(engine::Builtin::new(c.threads)) as Arc<dyn engine::Engine>;
    let needs_blender = matches!(c.choice, "auto" | "blender");
    let installs = if needs_blender {
        blender_installs(&c)?
    } else {
        Vec::new()
    };
    let device = match (c.blender_device, installs.first()) {
        (Some(d), _) => d,
        (None, Some(i)) => blender_runtime::auto_device(&i.offer.devices)
            .parse()
            .expect("a known device"),
        (None, None) => blender::Device::Cpu,
    };
    let blender_engine = (needs_blender && (!installs.is_empty() || c.auto)).then(|| {
        Arc::new(blender::Blender::new(
            installs.clone(),
            device,
            c.slots,
            !c.blender_cold,
            c.threads,
        ))
    });
    let blender = || blender_engine.clone().map(|b| b as Arc<dyn engine::Engine>);
    let engines = match c.choice {
        "auto" => {
            let mut engines = vec![builtin()];
            match blender() {
                Some(b) => engines.insert(0, b),
                None => tracing::info!("blender not found (set TESSERA_BLENDER or install it); not offering the blender engine"),
            }
            engines.extend(c.unreal.clone());
            engines
        }
        "builtin" => vec![builtin()],
        "blender" => vec![blender().context(
            "--engine blender: Blender is not installed here (or TESSERA_BLENDER does not name a working blender)",
        )?],
        "noop" => vec![Arc::new(engine::Noop {
            per_task: std::time::Duration::from_millis(c.noop_ms),
        }) as Arc<dyn engine::Engine>],
        "unreal" => vec![c.unreal.clone().context(
            "--engine unreal needs --unreal-editor PATH (Unreal's UnrealEditor-Cmd)",
        )?],
        other => anyhow::bail!("unknown engine `{other}` (expected auto, builtin, blender or unreal)"),
    };
    Ok((engines, blender_engine))
}

/// `auto` or a count of at least 1.
fn parse_sample_ranges(s: &str) -> Result<u32, String> {
    match s {
        "auto" => Ok(tessera_protocol::job::SAMPLE_RANGES_AUTO),
        n => match n.parse::<u32>() {
            Ok(k) if k >= 1 => Ok(k),
            _ => Err(format!("`{n}` is not `auto` or a count of at least 1")),
        },
    }
}

/// This machine's host name (`worker` when it has none).
fn host_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let host = host.trim();
    if host.is_empty() {
        "worker".into()
    } else {
        host.to_string()
    }
}

/// A worker started without `--name` or `--cache-dir`: named after the
/// host, the same name on every start (and so the same identity, cache and
/// drain target), `HOST-2`, `HOST-3` … for further workers running on the
/// machine at once; each holds a lock on its cache folder while it runs.
fn default_worker_name() -> anyhow::Result<(String, PathBuf, std::fs::File)> {
    use std::os::fd::AsRawFd;
    let host = host_name();
    for n in 1..=64u32 {
        let name = if n == 1 {
            host.clone()
        } else {
            format!("{host}-{n}")
        };
        let dir = default_cache_dir(&name);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create the cache folder {}", dir.display()))?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("worker.lock"))
            .with_context(|| format!("cannot lock the cache folder {}", dir.display()))?;
        // SAFETY: flock on a descriptor this function owns; released when
        // the file is closed (the process ends).
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok((name, dir, lock));
        }
    }
    anyhow::bail!(
        "64 workers without --name already run on this machine; pass --name and --cache-dir"
    )
}

fn default_cache_dir(name: &str) -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("tessera").join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_duration_ago_or_a_utc_time() {
        assert_eq!(parse_utc("1970-01-02"), Some(86_400_000));
        assert_eq!(parse_utc("2026-12-01T09:30:00Z"), Some(1_796_117_400_000));
        assert_eq!(parse_utc("2026-12-01T09:30"), Some(1_796_117_400_000));
        assert_eq!(
            parse_utc("2026-12-01T10:30:00+01:00"),
            Some(1_796_117_400_000)
        );
        assert_eq!(parse_utc("2000-02-29T00:00:00Z"), Some(951_782_400_000));
        for bad in ["2026-13-01", "2026-12-01T25:00", "2026-12-01X", "2026-1-1"] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
        let now = parse_since("0s").unwrap();
        let hour_ago = parse_since("1h").unwrap();
        assert!(now - hour_ago >= 3_599_000 && now - hour_ago <= 3_601_000);
        assert!(parse_since("soon").is_err());
        assert_eq!(
            parse_states("active").unwrap().0,
            vec![JobState::Queued, JobState::Running]
        );
        assert!(parse_states("paused")
            .unwrap_err()
            .contains("not a job state"));
    }

    #[test]
    fn slots_and_devices_take_auto_or_a_bounded_value() {
        assert!(matches!(parse_slots("auto"), Ok(Slots::Auto)));
        assert!(matches!(parse_slots("4"), Ok(Slots::Count(4))));
        for bad in ["0", "257", "-1", "many"] {
            assert!(
                parse_slots(bad)
                    .unwrap_err()
                    .contains("slot count from 1 to 256"),
                "{bad}"
            );
        }
        assert!(parse_device("auto").unwrap().0.is_none());
        assert_eq!(
            parse_device("optix").unwrap().0,
            Some(blender::Device::Optix)
        );
        assert_eq!(
            parse_device("ONEAPI").unwrap().0,
            Some(blender::Device::Oneapi)
        );
        assert!(parse_device("metal")
            .unwrap_err()
            .contains("expected auto, CPU"));
    }
}
