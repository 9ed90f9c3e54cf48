//! The coordinator's async layer: the QUIC server, one task per connection,
//! the dispatcher that feeds the scheduler core, the group-commit thread that
//! makes results durable before they are acknowledged, and stitching.
//!
//! The scheduler core and the job table live in [`Core`] under a std mutex
//! that is never held across an `.await`; connections hold a channel to their
//! worker, not a socket.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use tessera_protocol::blob::{self, BlobDir};
use tessera_protocol::job::{
    sanitize_manifest_path, Engine, JobSpec, OutputFormat, SAMPLE_RANGES_AUTO,
};
use tessera_protocol::messages::{
    ClientRequest, ClientResponse, Collected, CoordMsg, FarmEvent, FarmStatus, FrameOutput, Hello,
    JobInfo, JobState, JobStatus, Role, RunningTask, Snapshot, TaskLog, TaskRef, TaskSpec,
    TileState, TileStatus, Welcome, WorkerInfo, WorkerMsg, WorkerState, WorkerStatus,
    MAX_INLINE_OUTPUT, PROTOCOL_VERSION,
};
use tessera_protocol::sums::SumTile;
use tessera_protocol::telemetry::Telemetry;
use tessera_protocol::ticket::Ticket;
use tessera_protocol::transport::{self, Channel, Identity, Timing};
use tessera_protocol::Digest;
use tokio::sync::{broadcast, mpsc, Notify};

use crate::cost::Ledger;
use crate::db::{Db, NewResult, StoredFrame};
use crate::scheduler::{self, Epoch, NewJob, Scheduler, TaskKey, WorkerId};
use crate::{exr, stitch};

/// How the coordinator runs.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    /// The address written into tickets, when it differs from `listen`
    /// (a public address in front of `0.0.0.0`).
    pub advertise: Option<SocketAddr>,
    pub heartbeat_ms: u64,
    pub lease_ms: u64,
    pub max_attempts: u32,
    /// The wait before a failed task's first retry; doubles with each
    /// further failure.
    pub retry_backoff_ms: u64,
    /// A task running this many percent of its job's mean task time, when
    /// the job has nothing left to hand out, is started again on an idle
    /// worker (0: never).
    pub straggler_percent: u32,
    /// Prefer workers whose cache holds a task's assets.
    pub cache_affinity: bool,
    /// How long a finished job's assets and frames are kept.
    pub retention: Duration,
}

impl Config {
    pub fn new(data_dir: PathBuf, listen: SocketAddr) -> Config {
        Config {
            data_dir,
            listen,
            advertise: None,
            heartbeat_ms: 1000,
            lease_ms: 2500,
            max_attempts: 3,
            retry_backoff_ms: 1000,
            straggler_percent: 300,
            cache_affinity: true,
            retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// A job as the coordinator tracks it in memory; rebuilt from the database
/// on start.
struct Job {
    spec: Arc<JobSpec>,
    /// Set once the job is done, failed or canceled.
    final_state: Option<JobState>,
    error: Option<String>,
    tasks_per_frame: u32,
    tasks_done: u32,
    /// Accepted results per frame position.
    done_per_frame: Vec<u32>,
    stitched: Vec<bool>,
    frames_done: u32,
    render_ms: u64,
    bytes_uploaded: u64,
    bytes_deduplicated: u64,
    /// Asset bytes served to workers for this job (this run).
    bytes_to_workers: u64,
    submitted_unix_ms: u64,
    finished_unix_ms: Option<u64>,
    paused: bool,
    /// When this coordinator run first leased one of its tasks, and how many
    /// were done then (for the ETA).
    started: Option<(scheduler::Millis, u32)>,
}

impl Job {
    fn new(
        spec: JobSpec,
        submitted_unix_ms: u64,
        bytes_uploaded: u64,
        bytes_deduplicated: u64,
    ) -> Job {
        let tasks_per_frame = spec.tiles.count() * spec.sample_ranges;
        let frames = spec.frames.len();
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
        }
    }

    fn tasks_total(&self) -> u32 {
        self.tasks_per_frame * self.spec.frames.len() as u32
    }

    /// Frame, tile and sample range of task `index`.
    fn task_spec(&self, task: TaskRef) -> TaskSpec {
        let spec = &self.spec;
        let frame_pos = task.index / self.tasks_per_frame;
        let rest = task.index % self.tasks_per_frame;
        let (tile, range) = (rest / spec.sample_ranges, rest % spec.sample_ranges);
        let (w, h) = spec.resolution;
        let k = spec.sample_ranges;
        let n = spec.samples;
        TaskSpec {
            task,
            frame: spec.frames[frame_pos as usize],
            tile: spec.tiles.rect(tile, w, h),
            samples: (n * range / k, n * (range + 1) / k),
            total_samples: n,
        }
    }

    fn status(&self, id: u64, running: u32, blocked: Option<String>) -> JobStatus {
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
        }
    }
}

struct WorkerConn {
    name: String,
    info: WorkerInfo,
    tx: mpsc::UnboundedSender<CoordMsg>,
    /// Jobs whose `JobInfo` this connection has already been sent.
    jobs_sent: HashSet<u64>,
    tasks_done: u64,
    /// Last reported (samples done, total) per running lease.
    progress: HashMap<TaskRef, (u32, u32)>,
    joined: Instant,
    telemetry: Option<Telemetry>,
    draining: bool,
}

/// Everything the scheduler decides with, under one lock.
struct Core {
    sched: Scheduler,
    jobs: BTreeMap<u64, Job>,
    workers: HashMap<WorkerId, WorkerConn>,
    next_worker: WorkerId,
    submit_seq: u64,
    ledger: Ledger,
    events: broadcast::Sender<(u64, FarmEvent)>,
    /// The scheduler's time base: milliseconds since this run started.
    clock: Instant,
    /// After a restart with unfinished jobs, no task is handed out before
    /// this time, so workers that were rendering can rejoin and keep their
    /// tasks instead of seeing them given to whoever comes first.
    rejoin_until: scheduler::Millis,
    /// Tasks whose lease ended without a result, until they are handed out
    /// again (to log how quickly a lost task restarts).
    requeued: HashSet<TaskKey>,
}

impl Core {
    fn now(&self) -> scheduler::Millis {
        self.clock.elapsed().as_millis() as u64
    }

    fn job_status(&self, id: u64) -> Option<JobStatus> {
        self.job_status_at(id, self.now())
    }

    fn emit(&self, event: FarmEvent) {
        // Nobody listening is fine; a slow listener lags, never blocks.
        let _ = self.events.send((unix_ms(), event));
    }

    /// Bills and forgets a lease that ended.
    fn lease_ended(
        &mut self,
        task: TaskKey,
        worker: WorkerId,
        finished: bool,
        now: scheduler::Millis,
    ) {
        self.ledger.lease_ended(task, worker, finished, now);
        let waiting = (self.sched.task_view(task)).is_some_and(|v| !v.done && v.lease.is_none());
        if !finished && waiting {
            self.requeued.insert(task);
        }
        if let Some(w) = self.workers.get_mut(&worker) {
            w.progress
                .retain(|t, _| (t.job, t.index) != (task.job, task.index));
        }
    }

    /// Status of every job, workers and farm figures, at `now`.
    fn snapshot(&self, now: scheduler::Millis) -> Snapshot {
        let workers = self.worker_statuses(now);
        let burn: f64 = workers.iter().map(|w| w.price_per_hour).sum();
        let idle: f64 = workers
            .iter()
            .filter(|w| w.state == WorkerState::Idle)
            .map(|w| w.price_per_hour)
            .sum();
        Snapshot {
            unix_ms: unix_ms(),
            jobs: self
                .jobs
                .keys()
                .filter_map(|&id| self.job_status_at(id, now))
                .collect(),
            workers,
            farm: FarmStatus {
                burn_usd_per_hour: burn,
                idle_usd_per_hour: idle,
            },
        }
    }

    fn worker_statuses(&self, now: scheduler::Millis) -> Vec<WorkerStatus> {
        let mut out: Vec<WorkerStatus> = self
            .workers
            .iter()
            .map(|(&id, w)| {
                let tasks: Vec<RunningTask> = self
                    .sched
                    .running_on(id)
                    .into_iter()
                    .filter_map(|(key, epoch)| {
                        let job = self.jobs.get(&key.job)?;
                        let lease = TaskRef {
                            job: key.job,
                            index: key.index,
                            epoch: epoch.0,
                        };
                        let spec = job.task_spec(lease);
                        Some(RunningTask {
                            job: key.job,
                            index: key.index,
                            frame: spec.frame,
                            tile: spec.tile,
                            progress: w.progress.get(&lease).copied(),
                        })
                    })
                    .collect();
                let state = if w.draining {
                    WorkerState::Draining
                } else if self.sched.is_silent(id, now) {
                    WorkerState::Silent
                } else if tasks.is_empty() {
                    WorkerState::Idle
                } else {
                    WorkerState::Busy
                };
                WorkerStatus {
                    id,
                    name: w.name.clone(),
                    hostname: w.info.hostname.clone(),
                    engines: w.info.engines.clone(),
                    slots: w.info.slots,
                    state,
                    running: tasks.len() as u32,
                    tasks_done: w.tasks_done,
                    price_per_hour: w.info.price_per_hour,
                    connected_secs: w.joined.elapsed().as_secs(),
                    tasks,
                    telemetry: w.telemetry.clone(),
                    interruptible: w.info.interruptible,
                }
            })
            .collect();
        out.sort_by_key(|w| w.id);
        out
    }
    fn running(&self, job: u64) -> u32 {
        self.sched.job_progress(job).map_or(0, |p| p.running)
    }

    fn job_status_at(&self, id: u64, now: scheduler::Millis) -> Option<JobStatus> {
        let j = self.jobs.get(&id)?;
        let mut status = j.status(id, self.running(id), self.blocked(id, j.spec.engine));
        status.cost_usd = self.ledger.job_cost(id, now);
        if j.final_state.is_none() {
            let remaining = status.tasks_total - status.tasks_done;
            status.cost_to_finish_usd = self.ledger.cost_to_finish(id, remaining, now);
            if let Some((since, done_then)) = j.started {
                let done = f64::from(j.tasks_done.saturating_sub(done_then));
                let secs = now.saturating_sub(since) as f64 / 1000.0;
                if done > 0.0 && secs > 0.0 {
                    status.eta_secs = Some(f64::from(remaining) * secs / done);
                }
            }
        }
        Some(status)
    }

    /// Why a job needing `engine` cannot progress now, if it cannot.
    fn blocked(&self, job: u64, engine: Engine) -> Option<String> {
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
        offering.iter().all(|&w| self.sched.is_blocklisted(job, w)).then(|| {
            let last = self.sched.last_error(job).map_or(String::new(), |e| format!("; last error: {e}"));
            format!("every connected worker offering the {engine} engine failed this job too often and is blocklisted for it{last}")
        })
    }

    /// Tells the holders of `leases` to stop working on them (the leases
    /// have ended).
    fn send_cancels(&mut self, leases: &[scheduler::Assignment]) {
        let now = self.now();
        for lease in leases {
            self.lease_ended(lease.task, lease.worker, false, now);
            if let Some(w) = self.workers.get(&lease.worker) {
                let _ = w.tx.send(CoordMsg::Cancel(TaskRef {
                    job: lease.task.job,
                    index: lease.task.index,
                    epoch: lease.epoch.0,
                }));
            }
        }
    }

    /// Marks a job final, tells workers to drop its leases, and returns
    /// nothing to persist (the caller persists).
    fn finish_job(&mut self, id: u64, state: JobState, error: Option<String>) {
        if state != JobState::Done {
            let leases = self.sched.cancel_job(id);
            self.send_cancels(&leases);
        }
        self.emit(FarmEvent::JobChanged { job: id, state });
        if let Some(job) = self.jobs.get_mut(&id) {
            job.final_state = Some(state);
            job.error = error;
            job.finished_unix_ms = Some(unix_ms());
        }
    }
}

/// A result accepted by the scheduler, waiting for its commit.
struct Commit {
    worker: WorkerId,
    worker_name: String,
    task: TaskRef,
    output: Digest,
    render_ms: u64,
}

struct Farm {
    core: Mutex<Core>,
    db: Mutex<Db>,
    store: BlobDir,
    wake: Notify,
    start: Instant,
    config: Config,
    worker_secret: String,
    client_secret: String,
    commits: mpsc::UnboundedSender<Commit>,
    runtime: tokio::runtime::Handle,
    /// Held by garbage collection and by each submit: a job's blobs are
    /// either seen as referenced by a collection or submitted after it.
    gc: Mutex<()>,
}

impl Farm {
    fn now(&self) -> scheduler::Millis {
        self.start.elapsed().as_millis() as u64
    }

    fn events(&self) -> broadcast::Receiver<(u64, FarmEvent)> {
        self.core().events.subscribe()
    }

    fn core(&self) -> std::sync::MutexGuard<'_, Core> {
        self.core.lock().expect("core lock poisoned")
    }

    fn db(&self) -> std::sync::MutexGuard<'_, Db> {
        self.db.lock().expect("db lock poisoned")
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A coordinator that is up and listening.
pub struct Coordinator {
    pub addr: SocketAddr,
    pub worker_ticket: Ticket,
    pub client_ticket: Ticket,
    endpoint: quinn::Endpoint,
    farm: Arc<Farm>,
}

/// Opens the data dir (creating it, the certificate and the tickets on first
/// start), restores every job, and starts listening.
pub async fn start(config: Config) -> anyhow::Result<Coordinator> {
    let dir = &config.data_dir;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the data dir {}", dir.display()))?;
    let identity = load_identity(dir)?;
    let previous = read_ticket(&dir.join("worker.ticket"));
    let previous_client = read_ticket(&dir.join("client.ticket"));

    // Keep the port of the previous run when asked for any port, so workers
    // holding the old ticket find the coordinator again after a restart.
    let mut endpoint = None;
    if config.listen.port() == 0 {
        if let Some(prev) = &previous {
            let addr = SocketAddr::new(config.listen.ip(), prev.addr.port());
            endpoint = transport::server_endpoint(addr, &identity, Timing::default()).ok();
        }
    }
    let endpoint = match endpoint {
        Some(e) => e,
        None => transport::server_endpoint(config.listen, &identity, Timing::default())?,
    };
    let bound = endpoint.local_addr()?;
    let advertised = match config.advertise {
        Some(a) => a,
        None if bound.ip().is_unspecified() => {
            bail!("listening on {bound}: pass --advertise HOST:PORT so tickets name an address workers can reach")
        }
        None => bound,
    };
    let fingerprint = identity.fingerprint();
    let ticket = |role, prev: Option<Ticket>| Ticket {
        role,
        addr: advertised,
        fingerprint: fingerprint.clone(),
        secret: prev
            .filter(|t| t.role == role)
            .map_or_else(Ticket::new_secret, |t| t.secret),
    };
    let worker_ticket = ticket(Role::Worker, previous);
    let client_ticket = ticket(Role::Client, previous_client);
    write_secret_file(&dir.join("worker.ticket"), &format!("{worker_ticket}\n"))?;
    write_secret_file(&dir.join("client.ticket"), &format!("{client_ticket}\n"))?;

    let mut db = Db::open(&dir.join("state.sqlite"))
        .with_context(|| format!("cannot open the database in {}", dir.display()))?;
    let generation = db.next_generation()?;
    let store = BlobDir::open(dir.join("blobs"))?;
    let mut sched = Scheduler::new(scheduler::Config {
        lease_ms: config.lease_ms,
        max_attempts: config.max_attempts,
        first_epoch: generation << 32,
        retry_backoff_ms: config.retry_backoff_ms,
        straggler_percent: config.straggler_percent,
    });
    sched.set_affinity(config.cache_affinity);
    let (commit_tx, commit_rx) = mpsc::unbounded_channel();
    let clock = Instant::now();
    let farm = Arc::new(Farm {
        core: Mutex::new(Core {
            sched,
            jobs: BTreeMap::new(),
            workers: HashMap::new(),
            next_worker: 1,
            submit_seq: 0,
            ledger: Ledger::default(),
            events: broadcast::channel(4096).0,
            clock,
            rejoin_until: 0,
            requeued: HashSet::new(),
        }),
        db: Mutex::new(db),
        store,
        wake: Notify::new(),
        start: clock,
        config: config.clone(),
        worker_secret: worker_ticket.secret.clone(),
        client_secret: client_ticket.secret.clone(),
        commits: commit_tx,
        runtime: tokio::runtime::Handle::current(),
        gc: Mutex::new(()),
    });
    let unstitched = restore(&farm)?;
    {
        let mut core = farm.core();
        if core.jobs.values().any(|j| j.final_state.is_none()) {
            core.rejoin_until = config.lease_ms;
            tracing::info!(
                wait_ms = config.lease_ms,
                "unfinished jobs: waiting for workers to rejoin with their tasks before handing out work"
            );
        }
    }
    for (job, frame_pos) in unstitched {
        spawn_stitch(&farm, job, frame_pos);
    }
    {
        let farm = farm.clone();
        std::thread::Builder::new()
            .name("commit".into())
            .spawn(move || committer(farm, commit_rx))?;
    }
    tokio::spawn(dispatcher(farm.clone()));
    {
        let farm = farm.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(GC_EVERY);
            loop {
                tick.tick().await;
                let farm = farm.clone();
                match tokio::task::spawn_blocking(move || collect_garbage(&farm)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!("garbage collection failed: {e:#}"),
                    Err(e) => tracing::warn!("garbage collection panicked: {e}"),
                }
            }
        });
    }
    {
        let (farm, endpoint) = (farm.clone(), endpoint.clone());
        tokio::spawn(async move {
            while let Some(incoming) = endpoint.accept().await {
                let farm = farm.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve_connection(farm, incoming).await {
                        tracing::debug!("connection ended: {e:#}");
                    }
                });
            }
        });
    }
    tracing::info!(%bound, %advertised, "coordinator listening");
    Ok(Coordinator {
        addr: bound,
        worker_ticket,
        client_ticket,
        endpoint,
        farm,
    })
}

impl Coordinator {
    /// Runs until `shutdown` resolves, then closes every connection.
    pub async fn run_until(self, shutdown: impl std::future::Future<Output = ()>) {
        shutdown.await;
        self.endpoint
            .close(0u32.into(), b"coordinator shutting down");
        let _ = tokio::time::timeout(Duration::from_secs(2), self.endpoint.wait_idle()).await;
        drop(self.farm);
    }
}

fn load_identity(dir: &Path) -> anyhow::Result<Identity> {
    let (cert, key) = (
        dir.join("coordinator.crt.der"),
        dir.join("coordinator.key.der"),
    );
    if cert.exists() && key.exists() {
        return Ok(Identity {
            cert_der: std::fs::read(&cert)
                .with_context(|| format!("reading {}", cert.display()))?,
            key_der: std::fs::read(&key).with_context(|| format!("reading {}", key.display()))?,
        });
    }
    let identity = Identity::generate()?;
    std::fs::write(&cert, &identity.cert_der)?;
    write_secret_file(&key, "")?;
    std::fs::write(&key, &identity.key_der)?;
    Ok(identity)
}

fn read_ticket(path: &Path) -> Option<Ticket> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Writes a file readable by its owner only.
fn write_secret_file(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    opts.mode(0o600);
    let mut f = opts
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()?;
    Ok(())
}

/// Rebuilds the job table and the scheduler from the database. Returns the
/// frames whose tasks are all done but which were not stitched yet.
fn restore(farm: &Farm) -> anyhow::Result<Vec<(u64, usize)>> {
    let db = farm.db();
    let mut core = farm.core();
    let now = farm.now();
    let mut unstitched = Vec::new();
    for stored in db.jobs()? {
        let id = stored.id;
        let mut job = Job::new(
            stored.spec,
            stored.submitted_ms,
            stored.bytes_uploaded,
            stored.bytes_deduplicated,
        );
        let mut done = vec![false; job.tasks_total() as usize];
        for r in db.results(id)? {
            if let Some(slot) = done.get_mut(r.index as usize) {
                *slot = true;
                job.tasks_done += 1;
                job.render_ms += r.render_ms;
                job.done_per_frame[(r.index / job.tasks_per_frame) as usize] += 1;
            }
        }
        for f in db.frames(id)? {
            if let Some(pos) = job.spec.frames.iter().position(|&x| x == f.frame) {
                job.stitched[pos] = true;
                job.frames_done += 1;
            }
        }
        core.ledger.restore_job(id, stored.cost_usd, job.tasks_done);
        if stored.state.is_final() {
            job.final_state = Some(stored.state);
            job.error = stored.error;
            job.finished_unix_ms = stored.finished_ms;
        } else {
            let pending: Vec<u32> = (0..job.tasks_total())
                .filter(|&i| !done[i as usize])
                .collect();
            for (pos, &n) in job.done_per_frame.iter().enumerate() {
                if n == job.tasks_per_frame && !job.stitched[pos] {
                    unstitched.push((id, pos));
                }
            }
            core.submit_seq += 1;
            let seq = core.submit_seq;
            core.sched.add_job(
                NewJob {
                    id,
                    priority: job.spec.priority,
                    submit_seq: seq,
                    engine: job.spec.engine.name().to_string(),
                    total: job.tasks_total(),
                    pending,
                },
                now,
            );
            core.sched.set_job_assets(id, job_assets(&job.spec));
            tracing::info!(
                job = id,
                done = job.tasks_done,
                total = job.tasks_total(),
                "resumed job"
            );
        }
        core.jobs.insert(id, job);
    }
    Ok(unstitched)
}

/// Hands out work: expires overdue leases and fills free slots, whenever
/// woken or when the next lease deadline passes.
async fn dispatcher(farm: Arc<Farm>) {
    loop {
        let deadline = {
            let mut core = farm.core();
            let now = farm.now();
            let core = &mut *core;
            let expired = core.sched.expire(now);
            for lost in &expired {
                let name = core
                    .workers
                    .get(&lost.worker)
                    .map_or("(gone)", |w| w.name.as_str());
                tracing::info!(
                    job = lost.task.job,
                    task = lost.task.index,
                    worker = lost.worker,
                    name,
                    "lease expired; task requeued"
                );
            }
            core.send_cancels(&expired);
            let hold = now < core.rejoin_until;
            let assignments = if hold {
                Vec::new()
            } else {
                core.sched.assign(now)
            };
            for a in assignments {
                let price = core
                    .workers
                    .get(&a.worker)
                    .map_or(0.0, |w| w.info.price_per_hour);
                core.ledger.lease_started(a.task, a.worker, price, now);
                core.emit(FarmEvent::TaskStarted {
                    job: a.task.job,
                    index: a.task.index,
                    worker: a.worker,
                });
                if let Some(job) = core.jobs.get_mut(&a.task.job) {
                    job.started.get_or_insert((now, job.tasks_done));
                }
                let (Some(job), Some(worker)) =
                    (core.jobs.get(&a.task.job), core.workers.get_mut(&a.worker))
                else {
                    continue;
                };
                let second = (core.sched.task_view(a.task))
                    .and_then(|v| v.lease)
                    .is_some_and(|(holder, _)| holder != a.worker);
                if second {
                    tracing::info!(
                        job = a.task.job,
                        task = a.task.index,
                        worker = a.worker,
                        "straggler: a second attempt started on an idle worker"
                    );
                }
                if core.requeued.remove(&a.task) {
                    tracing::info!(
                        job = a.task.job,
                        task = a.task.index,
                        worker = a.worker,
                        name = worker.name.as_str(),
                        unix_ms = unix_ms(),
                        "requeued task restarted"
                    );
                }
                if worker.jobs_sent.insert(a.task.job) {
                    let spec = &job.spec;
                    let _ = worker.tx.send(CoordMsg::Job(JobInfo {
                        job: a.task.job,
                        engine: spec.engine,
                        scene: spec.scene.clone(),
                        manifest: spec.manifest.clone(),
                        resolution: spec.resolution,
                        output: spec.output,
                    }));
                }
                let task = TaskRef {
                    job: a.task.job,
                    index: a.task.index,
                    epoch: a.epoch.0,
                };
                let _ = worker.tx.send(CoordMsg::Assign(job.task_spec(task)));
            }
            let next = core.sched.next_deadline();
            if hold {
                next.into_iter().chain([core.rejoin_until]).min()
            } else {
                next
            }
        };
        // While anything runs, look again every heartbeat: a task may have
        // become a straggler.
        let sleep = match deadline {
            Some(at) => Duration::from_millis(
                (at.saturating_sub(farm.now()) + 1).min(farm.config.heartbeat_ms.max(50)),
            ),
            None => Duration::from_secs(3600),
        };
        tokio::select! {
            _ = farm.wake.notified() => {}
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}

/// The group-commit thread: writes accepted results in batches, then
/// acknowledges them and counts them, and starts stitching finished frames.
fn committer(farm: Arc<Farm>, mut rx: mpsc::UnboundedReceiver<Commit>) {
    while let Some(first) = rx.blocking_recv() {
        let mut batch = vec![first];
        while batch.len() < 4096 {
            match rx.try_recv() {
                Ok(c) => batch.push(c),
                Err(_) => break,
            }
        }
        let rows: Vec<NewResult<'_>> = batch
            .iter()
            .map(|c| NewResult {
                job: c.task.job,
                index: c.task.index,
                output: c.output,
                render_ms: c.render_ms,
                worker: &c.worker_name,
                epoch: c.task.epoch,
            })
            .collect();
        let costs: Vec<(u64, f64)> = {
            let core = farm.core();
            let mut jobs: Vec<u64> = batch.iter().map(|c| c.task.job).collect();
            jobs.sort_unstable();
            jobs.dedup();
            jobs.into_iter()
                .map(|j| (j, core.ledger.closed_cost(j)))
                .collect()
        };
        let outcome = farm.db().insert_results(&rows, &costs);
        let mut to_stitch = Vec::new();
        let mut failed_jobs = Vec::new();
        {
            let mut core = farm.core();
            let core = &mut *core;
            for (i, c) in batch.iter().enumerate() {
                let (accepted, reason) = match &outcome {
                    Ok(fresh) => {
                        if fresh[i] {
                            core.emit(FarmEvent::TaskFinished {
                                job: c.task.job,
                                index: c.task.index,
                                worker: c.worker,
                                render_ms: c.render_ms,
                            });
                            if let Some(job) = core.jobs.get_mut(&c.task.job) {
                                job.tasks_done += 1;
                                job.render_ms += c.render_ms;
                                let pos = (c.task.index / job.tasks_per_frame) as usize;
                                job.done_per_frame[pos] += 1;
                                if job.done_per_frame[pos] == job.tasks_per_frame {
                                    to_stitch.push((c.task.job, pos));
                                }
                            }
                        }
                        (true, None)
                    }
                    Err(e) => {
                        failed_jobs.push((
                            c.task.job,
                            format!("the coordinator could not store a result: {e}"),
                        ));
                        (false, Some(e.to_string()))
                    }
                };
                if let Some(w) = core.workers.get_mut(&c.worker) {
                    w.tasks_done += u64::from(accepted);
                    let _ = w.tx.send(CoordMsg::Ack {
                        task: c.task,
                        accepted,
                        reason,
                    });
                }
            }
        }
        for (job, error) in failed_jobs {
            fail_job(&farm, job, error);
        }
        for (job, pos) in to_stitch {
            spawn_stitch(&farm, job, pos);
        }
        farm.wake.notify_one();
    }
}

fn fail_job(farm: &Farm, job: u64, error: String) {
    tracing::error!(job, "job failed: {error}");
    farm.core()
        .finish_job(job, JobState::Failed, Some(error.clone()));
    if let Err(e) = farm
        .db()
        .set_state(job, JobState::Failed, Some(unix_ms()), Some(&error))
    {
        tracing::error!(job, "cannot record the failure: {e}");
    }
}

fn spawn_stitch(farm: &Arc<Farm>, job: u64, frame_pos: usize) {
    let farm2 = farm.clone();
    farm.runtime.spawn_blocking(move || {
        if let Err(e) = stitch_frame(&farm2, job, frame_pos) {
            fail_job(&farm2, job, format!("stitching failed: {e:#}"));
        }
    });
}

fn stitch_frame(farm: &Farm, job_id: u64, frame_pos: usize) -> anyhow::Result<()> {
    let (spec, per_frame) = {
        let core = farm.core();
        let job = core.jobs.get(&job_id).context("job vanished")?;
        if job.stitched[frame_pos] || job.final_state.is_some() {
            return Ok(());
        }
        (job.spec.clone(), job.tasks_per_frame)
    };
    let frame = spec.frames[frame_pos];
    let first = frame_pos as u32 * per_frame;
    let outputs = farm.db().result_range(job_id, first, per_frame)?;
    if outputs.len() != per_frame as usize {
        bail!(
            "frame {frame}: {} of {per_frame} results are stored",
            outputs.len()
        );
    }
    let (w, h) = spec.resolution;
    let ranges = spec.sample_ranges as usize;
    // Outputs are in task order: tile after tile, each with its sample ranges.
    let mut tiles = Vec::with_capacity(outputs.len() / ranges);
    for (i, chunk) in outputs.chunks(ranges).enumerate() {
        let parts = chunk
            .iter()
            .map(|d| farm.store.read(d))
            .collect::<Result<Vec<_>, _>>()?;
        tiles.push((spec.tiles.rect(i as u32, w, h), parts));
    }
    let float = tiles
        .iter()
        .all(|(_, parts)| parts.iter().all(|p| stitch::is_float_tile(p)));
    let sums = (tiles.iter()).all(|(_, parts)| parts.iter().all(|p| SumTile::is_sums(p)));
    let whole = tiles.len() == 1
        && tiles[0].1.len() == 1
        && (tiles[0].0.width, tiles[0].0.height) == (w, h);
    let layers =
        ranges == 1 && (tiles.iter()).all(|(_, parts)| parts.iter().all(|p| exr::is_exr(p)));
    let image = if whole && !sums && !float {
        // One task rendered the whole frame: the renderer's file is the
        // frame, untouched (its format, passes, codec and metadata).
        tiles.remove(0).1.remove(0)
    } else if layers {
        // OpenEXR tiles with every layer and pass: stitched channel by
        // channel, written with the scene's codec and metadata.
        let tiles: Vec<_> = tiles
            .into_iter()
            .map(|(rect, mut parts)| (rect, parts.remove(0)))
            .collect();
        exr::stitch_layers(w, h, &tiles).with_context(|| format!("frame {frame}"))?
    } else if sums {
        stitch::stitch_sums(w, h, &tiles, spec.samples).with_context(|| format!("frame {frame}"))?
    } else if float {
        let rgba = stitch::stitch_float(w, h, &tiles).with_context(|| format!("frame {frame}"))?;
        if spec.output != OutputFormat::Exr {
            bail!("frame {frame}: float tiles need EXR output");
        }
        exr::encode_rgba_f32(w, h, &rgba)
    } else {
        if ranges != 1 {
            bail!("frame {frame}: sample ranges must render float tiles");
        }
        let pngs: Vec<_> = tiles
            .into_iter()
            .map(|(rect, mut parts)| (rect, parts.remove(0)))
            .collect();
        stitch::stitch_png(w, h, &pngs).with_context(|| format!("frame {frame}"))?
    };
    let digest = farm.store.put_bytes(&image)?;
    farm.db().insert_frame(
        job_id,
        &StoredFrame {
            frame,
            digest,
            size: image.len() as u64,
        },
    )?;
    let done = {
        let mut core = farm.core();
        let job = core.jobs.get_mut(&job_id).context("job vanished")?;
        if !job.stitched[frame_pos] {
            job.stitched[frame_pos] = true;
            job.frames_done += 1;
        }
        job.frames_done == job.spec.frames.len() as u32 && job.final_state.is_none()
    };
    tracing::info!(job = job_id, frame, "frame stitched");
    if done {
        farm.core().finish_job(job_id, JobState::Done, None);
        farm.db()
            .set_state(job_id, JobState::Done, Some(unix_ms()), None)?;
        tracing::info!(job = job_id, "job done");
    }
    Ok(())
}

async fn serve_connection(farm: Arc<Farm>, incoming: quinn::Incoming) -> anyhow::Result<()> {
    let conn = incoming.await?;
    let mut control = Channel::new(
        tokio::time::timeout(Duration::from_secs(10), conn.accept_bi())
            .await
            .context("no hello within 10 s")??,
    );
    let hello: Hello = control.recv().await?.context("closed before hello")?;
    let role = match transport::check_hello(&hello, &farm.worker_secret, &farm.client_secret) {
        Ok(role) => role,
        Err(reason) => {
            tracing::warn!(peer = %conn.remote_address(), "refused: {reason}");
            control.send(&Welcome::Refused { reason }).await?;
            let _ = control.send.finish();
            let _ = tokio::time::timeout(Duration::from_secs(2), control.send.stopped()).await;
            conn.close(1u32.into(), b"refused");
            return Ok(());
        }
    };
    control
        .send(&Welcome::Accepted {
            version: PROTOCOL_VERSION,
        })
        .await?;
    let uploaded = Arc::new(AtomicU64::new(0));
    {
        let (farm, conn, uploaded) = (farm.clone(), conn.clone(), uploaded.clone());
        tokio::spawn(async move { serve_blob_streams(farm, conn, uploaded).await });
    }
    match role {
        Role::Worker => serve_worker(farm, conn, control, hello.name).await,
        Role::Client => serve_client(farm, control, uploaded).await,
    }
}

async fn serve_blob_streams(farm: Arc<Farm>, conn: quinn::Connection, uploaded: Arc<AtomicU64>) {
    while let Ok(streams) = conn.accept_bi().await {
        let (farm, uploaded) = (farm.clone(), uploaded.clone());
        tokio::spawn(async move {
            let mut ch = Channel::new(streams);
            if let Err(e) = serve_blob(&farm, &mut ch, &uploaded).await {
                tracing::debug!("blob stream: {e:#}");
            }
        });
    }
}

async fn serve_blob(farm: &Farm, ch: &mut Channel, uploaded: &AtomicU64) -> anyhow::Result<()> {
    if let blob::Answered::Get {
        job: Some(job),
        sent,
        ..
    } = blob::answer(&farm.store, ch, uploaded).await?
    {
        if let Some(j) = farm.core().jobs.get_mut(&job) {
            j.bytes_to_workers += sent;
        }
    }
    Ok(())
}

async fn serve_worker(
    farm: Arc<Farm>,
    conn: quinn::Connection,
    control: Channel,
    name: String,
) -> anyhow::Result<()> {
    let (mut send, mut recv) = control.split();
    let info = match tessera_protocol::codec::read_frame::<WorkerMsg, _>(&mut recv).await? {
        Some(WorkerMsg::Join(info)) => info,
        other => bail!("worker {name} sent {other:?} before joining"),
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let id = {
        let mut core = farm.core();
        let id = core.next_worker;
        core.next_worker += 1;
        let engines = info.engines.iter().map(|e| e.name().to_string()).collect();
        core.sched.add_worker(id, info.slots, engines, farm.now());
        core.sched.worker_holds(id, &info.cached, &[]);
        core.workers.insert(
            id,
            WorkerConn {
                name: name.clone(),
                info: info.clone(),
                tx: tx.clone(),
                jobs_sent: HashSet::new(),
                tasks_done: 0,
                progress: HashMap::new(),
                joined: Instant::now(),
                telemetry: None,
                draining: false,
            },
        );
        core.emit(FarmEvent::WorkerJoined {
            worker: id,
            name: name.clone(),
        });
        id
    };
    tracing::info!(worker = id, %name, slots = info.slots, engines = ?info.engines, peer = %conn.remote_address(), "worker joined");
    let _ = tx.send(CoordMsg::Joined {
        worker_id: id,
        heartbeat_ms: farm.config.heartbeat_ms,
        lease_ms: farm.config.lease_ms,
    });
    adopt_held_tasks(&farm, id, &name, &info.holding);
    farm.wake.notify_one();
    let writer = tokio::spawn(async move {
        while let Some(msg) = rx.recv().await {
            if tessera_protocol::codec::write_frame(&mut send, &msg)
                .await
                .is_err()
            {
                break;
            }
        }
    });
    let result = async {
        while let Some(msg) = tessera_protocol::codec::read_frame::<WorkerMsg, _>(&mut recv).await?
        {
            handle_worker_msg(&farm, id, &name, &tx, msg);
        }
        anyhow::Ok(())
    }
    .await;
    let requeued = {
        let mut core = farm.core();
        let now = core.now();
        let requeued = core.sched.remove_worker(id, now);
        for &task in &requeued {
            core.lease_ended(task, id, false, now);
        }
        core.workers.remove(&id);
        core.emit(FarmEvent::WorkerLeft {
            worker: id,
            name: name.clone(),
        });
        requeued
    };
    tracing::info!(worker = id, %name, requeued = requeued.len(), "worker left");
    farm.wake.notify_one();
    writer.abort();
    result
}

/// Takes over the leases of the tasks a (re)joining worker still holds, so
/// that work still rendering when the coordinator restarted, or when the
/// worker's connection dropped, is not rendered again; tells it to drop the
/// rest.
fn adopt_held_tasks(farm: &Farm, id: WorkerId, name: &str, holding: &[TaskRef]) {
    let mut core = farm.core();
    let core = &mut *core;
    let now = core.now();
    for &task in holding {
        let key = TaskKey {
            job: task.job,
            index: task.index,
        };
        match core.sched.adopt(id, key, Epoch(task.epoch), now) {
            Ok(()) => {
                tracing::info!(
                    worker = id,
                    name,
                    job = task.job,
                    task = task.index,
                    epoch = task.epoch,
                    "task re-adopted from the rejoining worker"
                );
                let price = core.workers.get(&id).map_or(0.0, |w| w.info.price_per_hour);
                core.ledger.lease_adopted(key, id, price, now);
                if let Some(job) = core.jobs.get_mut(&task.job) {
                    job.started.get_or_insert((now, job.tasks_done));
                }
                if let Some(w) = core.workers.get_mut(&id) {
                    w.jobs_sent.insert(task.job);
                }
                core.emit(FarmEvent::TaskStarted {
                    job: task.job,
                    index: task.index,
                    worker: id,
                });
            }
            Err(refused) => {
                tracing::info!(
                    worker = id,
                    name,
                    job = task.job,
                    task = task.index,
                    "not re-adopted: {refused}"
                );
                if let Some(w) = core.workers.get(&id) {
                    let _ = w.tx.send(CoordMsg::Cancel(task));
                }
            }
        }
    }
}

fn handle_worker_msg(
    farm: &Farm,
    id: WorkerId,
    name: &str,
    tx: &mpsc::UnboundedSender<CoordMsg>,
    msg: WorkerMsg,
) {
    let refuse = |task: TaskRef, reason: String| {
        tracing::info!(
            worker = id,
            job = task.job,
            task = task.index,
            "result refused: {reason}"
        );
        let _ = tx.send(CoordMsg::Ack {
            task,
            accepted: false,
            reason: Some(reason),
        });
    };
    if let WorkerMsg::Done { task, .. } | WorkerMsg::Failed { task, .. } = &msg {
        if let Some(w) = farm.core().workers.get_mut(&id) {
            w.progress.remove(task);
        }
    }
    match msg {
        WorkerMsg::Join(_) => {}
        WorkerMsg::Cached { added, removed } => {
            farm.core().sched.worker_holds(id, &added, &removed);
        }
        WorkerMsg::Draining => {
            let mut core = farm.core();
            core.sched.drain_worker(id);
            if let Some(w) = core.workers.get_mut(&id) {
                w.draining = true;
            }
            tracing::info!(
                worker = id,
                name,
                "worker shutting down: no new work for it"
            );
        }
        WorkerMsg::Progress { task, done, total } => {
            if let Some(w) = farm.core().workers.get_mut(&id) {
                w.progress.insert(task, (done, total));
            }
        }
        WorkerMsg::Heartbeat { telemetry } => {
            let mut core = farm.core();
            if let (Some(t), Some(w)) = (telemetry, core.workers.get_mut(&id)) {
                w.telemetry = Some(t);
            }
            if core.sched.heartbeat(id, farm.now()) {
                farm.wake.notify_one();
            }
        }
        WorkerMsg::Done {
            task,
            output,
            render_ms,
            inline,
        } => {
            if let Some(bytes) = inline {
                if bytes.len() > MAX_INLINE_OUTPUT || Digest::of(&bytes) != output {
                    return refuse(
                        task,
                        format!("inline output does not match its digest {output}"),
                    );
                }
                if let Err(e) = farm.store.put_bytes(&bytes) {
                    return refuse(task, format!("cannot store the output: {e}"));
                }
            } else if !farm.store.contains(&output) {
                return refuse(task, format!("output blob {output} was not uploaded"));
            }
            let key = TaskKey {
                job: task.job,
                index: task.index,
            };
            let verdict = {
                let mut core = farm.core();
                let now = core.now();
                let verdict = core.sched.complete(id, key, Epoch(task.epoch), now);
                if verdict.is_ok() {
                    core.lease_ended(key, id, true, now);
                    // The other attempt of a straggler lost the race.
                    let lost = core.sched.take_superseded();
                    for l in &lost {
                        tracing::info!(
                            job = task.job,
                            task = task.index,
                            worker = l.worker,
                            winner = id,
                            "superseded: another attempt of the task finished first"
                        );
                    }
                    core.send_cancels(&lost);
                }
                verdict
            };
            match verdict {
                Ok(_) => {
                    let _ = farm.commits.send(Commit {
                        worker: id,
                        worker_name: name.to_string(),
                        task,
                        output,
                        render_ms,
                    });
                }
                Err(refused) => refuse(task, refused.to_string()),
            }
        }
        WorkerMsg::Failed {
            task,
            error,
            log,
            unsupported,
        } => {
            let entry = TaskLog {
                task: task.index,
                worker: id,
                unix_ms: unix_ms(),
                error: error.clone(),
                log,
            };
            if let Err(e) = farm.db().insert_task_log(task.job, &entry) {
                tracing::warn!(job = task.job, "cannot keep a failed task's log: {e}");
            }
            tracing::warn!(
                worker = id,
                job = task.job,
                task = task.index,
                "task failed: {error}"
            );
            let key = TaskKey {
                job: task.job,
                index: task.index,
            };
            let outcome = {
                let mut core = farm.core();
                let now = core.now();
                let outcome = core
                    .sched
                    .fail(id, key, Epoch(task.epoch), error.clone(), now);
                if outcome.is_ok() {
                    if unsupported {
                        // It would fail every task of the job the same way.
                        core.sched.blocklist(task.job, id);
                    }
                    core.lease_ended(key, id, false, now);
                    core.emit(FarmEvent::TaskFailed {
                        job: task.job,
                        index: task.index,
                        worker: id,
                        error: error.clone(),
                    });
                }
                outcome
            };
            match outcome {
                Ok(outcome) if outcome.job_failed => {
                    let collected = {
                        let mut core = farm.core();
                        core.send_cancels(&outcome.cancel);
                        match core.sched.job_state(task.job) {
                            Some(scheduler::JobState::Failed(errors)) => errors,
                            _ => error.clone(),
                        }
                    };
                    fail_job(
                        farm,
                        task.job,
                        format!(
                            "task {} failed {} times: {collected}",
                            task.index, outcome.attempts
                        ),
                    );
                }
                Ok(outcome) => {
                    if outcome.blocklisted {
                        tracing::warn!(
                            worker = id,
                            name,
                            job = task.job,
                            "worker blocklisted for this job after {} failures",
                            scheduler::BLOCKLIST_AFTER
                        );
                    }
                }
                Err(refused) => refuse(task, refused.to_string()),
            }
            farm.wake.notify_one();
        }
    }
}

async fn serve_client(
    farm: Arc<Farm>,
    mut control: Channel,
    uploaded: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    while let Some(request) = control.recv::<ClientRequest>().await? {
        let response = match request {
            ClientRequest::MissingBlobs(digests) => ClientResponse::Missing(
                digests
                    .into_iter()
                    .filter(|d| !farm.store.touch(d))
                    .collect(),
            ),
            ClientRequest::KnownLists(lists) => {
                let store = farm.store.clone();
                ClientResponse::Known(
                    tokio::task::spawn_blocking(move || {
                        lists.iter().map(|l| store.file_of_list(l)).collect()
                    })
                    .await?,
                )
            }
            ClientRequest::Assemble(list) => {
                let store = farm.store.clone();
                match tokio::task::spawn_blocking(move || store.assemble_list(&list)).await? {
                    Ok(file) => ClientResponse::Assembled(file),
                    Err(e) => ClientResponse::Error(e.to_string()),
                }
            }
            ClientRequest::CollectGarbage => {
                let farm = farm.clone();
                match tokio::task::spawn_blocking(move || collect_garbage(&farm)).await? {
                    Ok(c) => ClientResponse::Collected(c),
                    Err(e) => ClientResponse::Error(format!("garbage collection failed: {e:#}")),
                }
            }
            ClientRequest::Submit(spec) => {
                let _gc = farm.gc.lock().expect("gc lock");
                match submit(&farm, spec, uploaded.swap(0, Ordering::Relaxed)) {
                    Ok(status) => ClientResponse::Submitted(status),
                    Err(e) => ClientResponse::Error(format!("{e:#}")),
                }
            }
            ClientRequest::Status(job) => {
                let core = farm.core();
                let now = core.now();
                match job {
                    Some(id) => match core.job_status_at(id, now) {
                        Some(status) => ClientResponse::Status {
                            jobs: vec![status],
                            workers: core.worker_statuses(now),
                        },
                        None => ClientResponse::Error(format!("no job {id} on this coordinator")),
                    },
                    None => {
                        let snapshot = core.snapshot(now);
                        ClientResponse::Status {
                            jobs: snapshot.jobs,
                            workers: snapshot.workers,
                        }
                    }
                }
            }
            ClientRequest::Cancel(id) => cancel(&farm, id),
            ClientRequest::Frames(id) => frames(&farm, id),
            ClientRequest::Logs { job, task } if !farm.core().jobs.contains_key(&job) => {
                let _ = task;
                ClientResponse::Error(format!("no job {job} on this coordinator"))
            }
            ClientRequest::Logs { job, task } => match farm.db().task_logs(job, task) {
                Ok(logs) => ClientResponse::Logs(logs),
                Err(e) => ClientResponse::Error(e.to_string()),
            },
            ClientRequest::Tiles { job, frame } => tiles(&farm, job, frame),
            ClientRequest::Pause { job, paused } => {
                let mut core = farm.core();
                if core.sched.pause_job(job, paused) {
                    if let Some(j) = core.jobs.get_mut(&job) {
                        j.paused = paused;
                    }
                    tracing::info!(job, paused, "job paused or resumed");
                    drop(core);
                    farm.wake.notify_one();
                    ClientResponse::Done
                } else {
                    ClientResponse::Error(format!("job {job} is not queued or running"))
                }
            }
            ClientRequest::Drain { worker } => {
                let mut core = farm.core();
                core.sched.drain_worker(worker);
                match core.workers.get_mut(&worker) {
                    Some(w) => {
                        w.draining = true;
                        let _ = w.tx.send(CoordMsg::Drain);
                        tracing::info!(worker, "worker asked to drain");
                        ClientResponse::Done
                    }
                    None => ClientResponse::Error(format!("no worker {worker} is connected")),
                }
            }
            ClientRequest::Subscribe => return feed(&farm, control).await,
        };
        control.send(&response).await?;
    }
    Ok(())
}

/// A monitor's feed: a snapshot now and every half second, and each event as
/// it happens. Events go through a bounded broadcast channel: a subscriber
/// that falls behind skips to a fresh snapshot, and never slows the farm.
async fn feed(farm: &Farm, mut control: Channel) -> anyhow::Result<()> {
    let mut events = farm.events();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        let msg = tokio::select! {
            _ = tick.tick() => {
                let core = farm.core();
                ClientResponse::Snapshot(core.snapshot(core.now()))
            }
            event = events.recv() => match event {
                Ok((unix_ms, event)) => ClientResponse::Event { unix_ms, event },
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    let core = farm.core();
                    ClientResponse::Snapshot(core.snapshot(core.now()))
                }
                Err(broadcast::error::RecvError::Closed) => return Ok(()),
            },
        };
        control.send(&msg).await?;
    }
}

fn frames(farm: &Farm, id: u64) -> ClientResponse {
    let Some((format, template)) = farm
        .core()
        .jobs
        .get(&id)
        .map(|j| (j.spec.output, j.spec.output_name.clone()))
    else {
        return ClientResponse::Error(format!("no job {id} on this coordinator"));
    };
    let stored = farm.db().frames(id);
    match stored {
        Ok(frames) => ClientResponse::Frames(
            frames
                .into_iter()
                .map(|f| FrameOutput {
                    frame: f.frame,
                    digest: f.digest,
                    size: f.size,
                    format,
                    name: template
                        .as_deref()
                        .and_then(|t| tessera_protocol::job::frame_file_name(t, f.frame)),
                })
                .collect(),
        ),
        Err(e) => ClientResponse::Error(e.to_string()),
    }
}

/// Every tile of one frame, for the mosaic.
fn tiles(farm: &Farm, job_id: u64, frame: u32) -> ClientResponse {
    let core = farm.core();
    let Some(job) = core.jobs.get(&job_id) else {
        return ClientResponse::Error(format!("no job {job_id} on this coordinator"));
    };
    let Some(pos) = job.spec.frames.iter().position(|&f| f == frame) else {
        return ClientResponse::Error(format!("job {job_id} does not render frame {frame}"));
    };
    let spec = &job.spec;
    let (w, h) = spec.resolution;
    let stitched = job.stitched[pos] || job.final_state == Some(JobState::Done);
    let mut out = Vec::new();
    for tile in 0..spec.tiles.count() {
        let mut state = if stitched {
            TileState::Done
        } else {
            TileState::Queued
        };
        if !stitched {
            let first = pos as u32 * job.tasks_per_frame + tile * spec.sample_ranges;
            let views: Vec<_> = (first..first + spec.sample_ranges)
                .filter_map(|index| {
                    core.sched
                        .task_view(TaskKey { job: job_id, index })
                        .map(|v| (index, v))
                })
                .collect();
            if !views.is_empty() && views.iter().all(|(_, v)| v.done) {
                state = TileState::Done;
            } else if let Some((index, (worker, epoch))) =
                views.iter().find_map(|(i, v)| v.lease.map(|l| (*i, l)))
            {
                let lease = TaskRef {
                    job: job_id,
                    index,
                    epoch: epoch.0,
                };
                let progress = core
                    .workers
                    .get(&worker)
                    .and_then(|w| w.progress.get(&lease).copied());
                state = TileState::Rendering(progress);
            } else if views.iter().any(|(_, v)| v.failures > 0)
                || job.final_state == Some(JobState::Failed)
            {
                state = TileState::Failed;
            }
        }
        out.push(TileStatus {
            tile: spec.tiles.rect(tile, w, h),
            state,
        });
    }
    ClientResponse::Tiles(out)
}

fn cancel(farm: &Farm, id: u64) -> ClientResponse {
    let state = farm.core().job_status(id).map(|s| s.state);
    match state {
        None => ClientResponse::Error(format!("no job {id} on this coordinator")),
        Some(s) if s.is_final() => {
            ClientResponse::Canceled(farm.core().job_status(id).expect("exists"))
        }
        Some(_) => {
            farm.core().finish_job(id, JobState::Canceled, None);
            if let Err(e) = farm
                .db()
                .set_state(id, JobState::Canceled, Some(unix_ms()), None)
            {
                return ClientResponse::Error(format!("cannot record the cancel: {e}"));
            }
            tracing::info!(job = id, "job canceled");
            ClientResponse::Canceled(farm.core().job_status(id).expect("exists"))
        }
    }
}

/// Validates and records a job; it is durable before the client hears of it.
fn submit(farm: &Farm, spec: JobSpec, uploaded: u64) -> anyhow::Result<JobStatus> {
    if let Some(rid) = &spec.request_id {
        if let Some(id) = farm.db().job_by_request(rid)? {
            return farm.core().job_status(id).context("job vanished");
        }
    }
    let mut spec = spec;
    if spec.sample_ranges == SAMPLE_RANGES_AUTO {
        spec.sample_ranges = auto_sample_ranges(&farm.core(), &spec);
    }
    validate(farm, &spec)?;
    let total: u64 = spec.manifest.iter().map(|m| m.size).sum();
    let dedup = total.saturating_sub(uploaded);
    let submitted = unix_ms();
    let id = farm.db().insert_job(&spec, submitted, uploaded, dedup)?;
    let job = Job::new(spec, submitted, uploaded, dedup);
    let status = {
        let mut core = farm.core();
        core.submit_seq += 1;
        let seq = core.submit_seq;
        let new = NewJob {
            id,
            priority: job.spec.priority,
            submit_seq: seq,
            engine: job.spec.engine.name().to_string(),
            total: job.tasks_total(),
            pending: (0..job.tasks_total()).collect(),
        };
        core.sched.add_job(new, farm.now());
        core.sched.set_job_assets(id, job_assets(&job.spec));
        let status = job.status(id, 0, core.blocked(id, job.spec.engine));
        core.jobs.insert(id, job);
        status
    };
    tracing::info!(job = id, name = %status.name, tasks = status.tasks_total, "job submitted");
    farm.wake.notify_one();
    Ok(status)
}

/// Sample ranges per tile for `--sample-ranges auto`: with an interruptible
/// worker on the farm (one heard from within its lease), each tile is split into [`CHECKPOINT_RANGES`] sample
/// ranges rendered as separate tasks, so a preempted worker loses at most
/// the one range it was rendering; otherwise tiles stay whole. Blender
/// merges ranges in float, so it splits only for EXR output.
fn auto_sample_ranges(core: &Core, spec: &JobSpec) -> u32 {
    let now = core.now();
    let interruptible = (core.workers.iter())
        .any(|(&id, w)| w.info.interruptible && !core.sched.is_silent(id, now));
    let splittable = match spec.engine {
        Engine::Builtin => true,
        Engine::Blender => spec.output == OutputFormat::Exr,
        _ => false,
    };
    let ranges = if interruptible && splittable {
        CHECKPOINT_RANGES.min(spec.samples).max(1)
    } else {
        1
    };
    tracing::info!(
        interruptible,
        ranges,
        "--sample-ranges auto: {} sample range(s) per tile",
        ranges
    );
    ranges
}

/// Sample ranges per tile that `--sample-ranges auto` asks for when some
/// worker is interruptible.
pub const CHECKPOINT_RANGES: u32 = 4;
/// How often garbage is collected (and once at start).
const GC_EVERY: Duration = Duration::from_secs(3600);
/// Blobs written (or asked about by a client) this recently are never
/// collected: an upload whose submit has not arrived yet, a worker's output
/// before its result is committed.
const GC_GRACE: Duration = Duration::from_secs(3600);

/// Removes stored blobs that no retained job uses. A job is retained until
/// `retention` after it finished (forever while it is not finished); it uses
/// its manifest's files, their chunks, its task outputs and its frames.
fn collect_garbage(farm: &Farm) -> anyhow::Result<Collected> {
    let _gc = farm.gc.lock().expect("gc lock");
    let now = unix_ms();
    let retention = farm.config.retention.as_millis() as u64;
    let mut keep = HashSet::new();
    {
        let db = farm.db();
        for job in db.jobs()? {
            let expired = job.state.is_final()
                && job
                    .finished_ms
                    .is_some_and(|f| f.saturating_add(retention) <= now);
            if expired {
                continue;
            }
            for m in &job.spec.manifest {
                keep.insert(m.digest);
                if let Some(recipe) = farm.store.recipe(&m.digest) {
                    keep.extend(recipe.chunks.iter().map(|c| c.digest));
                }
            }
            keep.extend(db.results(job.id)?.into_iter().map(|r| r.output));
            keep.extend(db.frames(job.id)?.into_iter().map(|f| f.digest));
        }
    }
    let young = std::time::SystemTime::now() - GC_GRACE;
    let mut c = Collected {
        removed_blobs: 0,
        removed_bytes: 0,
        kept_blobs: 0,
        kept_bytes: 0,
    };
    for (digest, size, written) in farm.store.list()? {
        if keep.contains(&digest) || written > young {
            c.kept_blobs += 1;
            c.kept_bytes += size;
        } else {
            farm.store.remove(&digest)?;
            c.removed_blobs += 1;
            c.removed_bytes += size;
        }
    }
    tracing::info!(
        removed = c.removed_blobs,
        removed_bytes = c.removed_bytes,
        kept = c.kept_blobs,
        "garbage collected"
    );
    Ok(c)
}

/// What every task of a job needs, for cache affinity.
fn job_assets(spec: &JobSpec) -> Vec<(Digest, u64)> {
    spec.manifest.iter().map(|m| (m.digest, m.size)).collect()
}

fn validate(farm: &Farm, spec: &JobSpec) -> anyhow::Result<()> {
    if spec.frames.is_empty() {
        bail!("the job has no frames");
    }
    let (w, h) = spec.resolution;
    if w == 0 || h == 0 || w > 65536 || h > 65536 {
        bail!("resolution {w}x{h} is out of range");
    }
    if spec.tiles.cols == 0 || spec.tiles.rows == 0 || spec.tiles.cols > w || spec.tiles.rows > h {
        bail!("tile grid {} does not fit a {w}x{h} frame", spec.tiles);
    }
    if spec.samples == 0 {
        bail!("the sample count must be at least 1");
    }
    if spec.sample_ranges == 0 || spec.sample_ranges > spec.samples {
        bail!(
            "--sample-ranges {} must be between 1 and the sample count {}",
            spec.sample_ranges,
            spec.samples
        );
    }
    if spec.sample_ranges > 1 && !matches!(spec.engine, Engine::Blender | Engine::Builtin) {
        bail!(
            "--sample-ranges needs the blender or builtin engine; the {} engine renders whole sample counts",
            spec.engine
        );
    }
    let tasks =
        u64::from(spec.tiles.count()) * u64::from(spec.sample_ranges) * spec.frames.len() as u64;
    if tasks > 10_000_000 {
        bail!("the job would have {tasks} tasks; the limit is 10,000,000");
    }
    let mut seen = HashSet::new();
    for entry in &spec.manifest {
        sanitize_manifest_path(&entry.path)?;
        if !seen.insert(entry.path.as_str()) {
            bail!("manifest path `{}` appears twice", entry.path);
        }
        if farm.store.size(&entry.digest) != Some(entry.size) {
            bail!(
                "`{}` ({}) was not uploaded; submit again to upload it",
                entry.path,
                entry.digest
            );
        }
    }
    if !seen.contains(spec.scene.as_str()) {
        bail!("the scene `{}` is not in the manifest", spec.scene);
    }
    Ok(())
}
