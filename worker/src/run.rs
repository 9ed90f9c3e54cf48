//! The worker's connection loop: join with the worker ticket (or, once
//! enrolled, its own credential: [`crate::identity`]), heartbeat,
//! render what is assigned on as many slots as it offers, upload outputs,
//! and reconnect with backoff and jitter whenever the coordinator goes away.
//! What it holds across connections is the pure [`TaskTable`]; this module
//! only connects, reconnects and moves messages.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use tessera_protocol::messages::{
    CoordMsg, JobInfo, TaskRef, TaskSpec, WorkerInfo, WorkerMsg, MAX_INLINE_OUTPUT,
};
use tessera_protocol::ticket::Ticket;
use tessera_protocol::Digest;
use tessera_transport::blob::{self, BlobSource};
use tessera_transport::framing;
use tessera_transport::{self as transport, Timing, TransportError};
use tokio::sync::{mpsc, watch};

use crate::cache::Cache;
use crate::engine::{Control, Engine, Failure};
use crate::identity;
use crate::idle_exit::IdleExit;
use crate::slots::{Slots, Turn};
use crate::tasks::{Outcome, Report, Stop, TaskTable};
use crate::telemetry::Sampler;

mod task;

use task::{run_task, TaskEnv};

/// How often telemetry rides along with a heartbeat.
const TELEMETRY_EVERY: Duration = Duration::from_secs(5);

pub struct Config {
    pub ticket: Ticket,
    /// The file the ticket was read from (`--ticket @FILE`): read again
    /// before each connection, so a worker follows the coordinators a
    /// rewritten ticket names (a standby added, an address moved).
    pub ticket_file: Option<PathBuf>,
    pub name: String,
    pub cache_dir: PathBuf,
    /// Cap on the blob cache's size in bytes (`--cache-max`).
    pub cache_max: Option<u64>,
    pub engines: Vec<Arc<dyn Engine>>,
    pub slots: u32,
    pub price_per_hour: f64,
    /// How long running tasks may take to finish before their leases are
    /// handed back, once the worker drains: on shutdown (SIGTERM) none
    /// unless set; asked by `tessera drain`, until they are done unless set.
    pub drain_grace: Option<Duration>,
    /// A spot or interruptible instance (reported to the coordinator).
    pub interruptible: bool,
    /// `--blender auto`: also render with the builds stored on the
    /// coordinator, fetched when a job first needs one.
    pub builds: Option<Arc<crate::builds::AutoBuilds>>,
    /// A renderer that prints nothing for this long is stopped as stalled
    /// and its task fails (`--stall-window`).
    pub stall_window: Duration,
    /// Renderer sessions with no task for this long are ended
    /// (`--session-idle`; `None`: kept until the worker stops).
    pub session_idle: Option<Duration>,
    /// `--exit-after-idle`: leave after this long with no task held or
    /// assigned, connected or not ([`crate::idle_exit`]).
    pub exit_after_idle: Option<Duration>,
}

/// Ends renderer sessions that have been idle for `idle`, checking a few
/// times per window, until dropped.
fn end_idle_sessions(engines: Vec<Arc<dyn Engine>>, idle: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(
            (idle / 4).clamp(Duration::from_millis(250), Duration::from_secs(15)),
        );
        loop {
            tick.tick().await;
            let engines = engines.clone();
            // Ending a session waits for its process: not on this thread.
            let _ = tokio::task::spawn_blocking(move || {
                for e in &engines {
                    e.end_idle_sessions(idle);
                }
            })
            .await;
        }
    })
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs until `shutdown` turns true. Returns an error only for problems
/// retrying cannot fix (a refused ticket, a protocol version mismatch).
///
/// Tasks outlive connections: a render goes on while the worker reconnects,
/// and a finished result is sent again on each new connection until the
/// coordinator acknowledges it. On joining, the worker names the tasks it
/// holds; the coordinator adopts those it can and cancels the rest, so a
/// coordinator restart or a dropped link costs no finished work.
pub async fn run(config: Config, mut shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    let cache = Arc::new(Cache::open(&config.cache_dir, config.cache_max)?);
    let _idle = (config.session_idle)
        .map(|idle| AbortOnDrop(end_idle_sessions(config.engines.clone(), idle)));
    let slots = Slots::new(config.slots.max(1) as usize);
    let config = Arc::new(config);
    let (finished_tx, finished_rx) = mpsc::unbounded_channel();
    let mut held = Held {
        table: TaskTable::default(),
        finished_tx,
        finished_rx,
        link: Arc::new(Mutex::new(None)),
        slots,
        idle: IdleExit::new(config.exit_after_idle),
        draining: false,
        // NVML and `/proc`, read once, off the runtime.
        host: tokio::task::spawn_blocking(crate::telemetry::host_facts).await?,
    };
    let mut backoff = reconnect_backoff();
    loop {
        let outcome = session(&config, &cache, &mut held, &mut shutdown, &mut backoff).await;
        *held.link.lock().expect("link lock") = None;
        match outcome {
            Err(e) => {
                if let Some(t) = e.downcast_ref::<TransportError>() {
                    if matches!(t, TransportError::Refused(_) | TransportError::Version(_)) {
                        return Err(e);
                    }
                }
                tracing::warn!(
                    held = held.table.len(),
                    "disconnected from the coordinator: {e:#}"
                );
            }
            Ok(SessionEnd::Drained) => return Ok(()),
            Ok(SessionEnd::Closed) => tracing::warn!(
                held = held.table.len(),
                "the coordinator closed the connection"
            ),
        }
        let jitter: f64 = rand::random_range(0.5..1.5);
        let wait = backoff.next().unwrap_or(MAX_RECONNECT_WAIT).mul_f64(jitter);
        tracing::info!("reconnecting in {} ms", wait.as_millis());
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|&s| s) => {
                held.table.stop_all();
                return Ok(());
            }
        }
        if idle_exit_now(&mut held) {
            return Ok(());
        }
    }
}

/// The longest wait between two attempts to reconnect, before jitter.
const MAX_RECONNECT_WAIT: Duration = Duration::from_secs(5);

/// The waits between attempts to reconnect: 200 ms doubling up to
/// [`MAX_RECONNECT_WAIT`] (each then jittered by half either way), from
/// the first again once a session has joined.
/// The ticket to connect with: the ticket file as it reads now, when it
/// still holds a worker ticket of the same coordinators (certificate), else
/// the ticket the worker started with.
fn current_ticket(config: &Config) -> Ticket {
    let Some(path) = &config.ticket_file else {
        return config.ticket.clone();
    };
    let read = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| text.trim().parse::<Ticket>().ok());
    match read {
        Some(t) if t.role == config.ticket.role && t.fingerprint == config.ticket.fingerprint => {
            if t.addrs().ne(config.ticket.addrs()) {
                tracing::info!(addrs = ?t.addrs().collect::<Vec<_>>(), "the ticket file names other coordinators now");
            }
            t
        }
        _ => config.ticket.clone(),
    }
}

/// How long a coordinator of a farm with a standby may send nothing (not
/// even the acknowledgements of heartbeats and keep-alives, which come at
/// least every second) before the worker takes it for gone.
const COORDINATOR_SILENT: Duration = Duration::from_secs(3);

/// When a connection last received anything.
struct Silence {
    watching: bool,
    datagrams: u64,
    since: Instant,
}

impl Silence {
    fn new(watching: bool, conn: &quinn::Connection) -> Silence {
        Silence {
            watching,
            datagrams: conn.stats().udp_rx.datagrams,
            since: Instant::now(),
        }
    }

    /// True once nothing arrived for [`COORDINATOR_SILENT`].
    fn gone(&mut self, conn: &quinn::Connection) -> bool {
        let now = conn.stats().udp_rx.datagrams;
        if now != self.datagrams {
            self.datagrams = now;
            self.since = Instant::now();
        }
        self.since.elapsed() >= COORDINATOR_SILENT
    }
}

fn reconnect_backoff() -> backon::ExponentialBackoff {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(MAX_RECONNECT_WAIT)
        .without_max_times()
        .build()
}

/// Whether the worker has been idle past `--exit-after-idle` (holding no
/// task, none assigned): then it says so and leaves.
fn idle_exit_now(held: &mut Held) -> bool {
    let holding = !held.table.is_empty();
    if !held.idle.expired(holding) {
        return false;
    }
    let secs = held.idle.bound().unwrap_or_default().as_secs_f64();
    tracing::info!(
        idle_secs = secs,
        "no task held or assigned for --exit-after-idle: leaving"
    );
    true
}

/// How a session ended without an error.
enum SessionEnd {
    /// The coordinator closed the connection: reconnect.
    Closed,
    /// Asked to drain, and done: leave.
    Drained,
}

/// The tasks this worker holds, across connections, and the channels its
/// renders report on.
struct Held {
    table: TaskTable<Render>,
    /// Render tasks report here when they end.
    finished_tx: mpsc::UnboundedSender<(TaskRef, Outcome)>,
    finished_rx: mpsc::UnboundedReceiver<(TaskRef, Outcome)>,
    /// The current connection's outgoing messages, for progress reports
    /// from renders that started over an earlier one.
    link: Link,
    /// The render slots: a task assigned beyond them (pipelined leases)
    /// fetches its files, then waits for its turn, in the order tasks were
    /// assigned.
    slots: Arc<Slots>,
    /// When the worker last held or was assigned a task.
    idle: IdleExit,
    /// Asked to drain (`tessera drain`): kept across connections, so a
    /// worker that reconnects mid-drain says so again and is given nothing.
    draining: bool,
    /// What this machine has, said at every join.
    host: tessera_protocol::host::HostFacts,
}

type Link = Arc<Mutex<Option<mpsc::UnboundedSender<WorkerMsg>>>>;

/// A running render: its task, and its control, whose cancel kills the
/// renderer at once.
struct Render {
    handle: tokio::task::AbortHandle,
    ctl: Arc<Control>,
}

impl Stop for Render {
    fn stop(&self) {
        self.ctl.cancel();
        self.handle.abort();
    }
}

/// Sends a finished task's report on this connection, uploading its output
/// first when needed. A failed upload leaves it for the next connection.
fn send_report(
    conn: &quinn::Connection,
    tx: &mpsc::UnboundedSender<WorkerMsg>,
    report: Arc<Report>,
) {
    let (conn, tx) = (conn.clone(), tx.clone());
    tokio::spawn(async move {
        if let (Some(bytes), WorkerMsg::Done { output, .. }) = (&report.upload, &report.msg) {
            let put = blob::put(&conn, *output, bytes.len() as u64, BlobSource::Bytes(bytes)).await;
            if let Err(e) = put {
                tracing::warn!("uploading an output failed; it is sent again on reconnect: {e:#}");
                return;
            }
        }
        let _ = tx.send(report.msg.clone());
    });
}

/// One connection, from join to loss. On `shutdown` (SIGTERM, as spot
/// platforms send before preemption) the worker takes no new work, waits up
/// to `drain_grace` for running tasks, then closes the connection so the
/// coordinator requeues what is left at once instead of waiting for leases to
/// expire.
///
/// Long because: its select loop owns the
/// connection's state (draining, the leave-by instant, the writer and the
/// heartbeat it started) and stops all of it on every way out; joining,
/// heartbeats and each message's handling are functions of their own.
async fn session(
    config: &Arc<Config>,
    cache: &Arc<Cache>,
    held: &mut Held,
    shutdown: &mut watch::Receiver<bool>,
    backoff: &mut backon::ExponentialBackoff,
) -> anyhow::Result<SessionEnd> {
    let ticket = current_ticket(config);
    let join_ticket = identity::join_ticket(&config.cache_dir, &ticket);
    let session = tokio::select! {
        s = transport::connect(&join_ticket, &config.name, Timing::default()) => s?,
        // While connecting there is nothing to hand back.
        _ = shutdown.wait_for(|&s| s) => {
            held.table.stop_all();
            return Ok(SessionEnd::Drained);
        }
    };
    let conn = session.connection.clone();
    // Written in the encoding the handshake agreed on (read in either).
    let codec = session.control.codec();
    let (mut send, mut recv) = session.control.split();
    let (tx, mut rx) = mpsc::unbounded_channel::<WorkerMsg>();
    let writer = tokio::spawn(async move {
        while let Some(msg) = rx.recv().await {
            if framing::write_frame_as(&mut send, codec, &msg)
                .await
                .is_err()
            {
                break;
            }
        }
    });
    let (heartbeat_ms, store_urls) = join(config, cache, held, &tx, &mut recv).await?;
    cache.set_store_urls(store_urls);
    *backoff = reconnect_backoff();
    cache.reset_jobs();
    *held.link.lock().expect("link lock") = Some(tx.clone());
    // Results finished before this connection: send them again.
    for report in held.table.unacknowledged() {
        send_report(&conn, &tx, report);
    }
    let heartbeat = tokio::spawn(heartbeat(tx.clone(), heartbeat_ms));
    // Asked to drain over an earlier connection: it said so when it
    // joined, and gets no new work.
    let mut draining = held.draining;
    // Set once draining with a grace (always on shutdown): leave when
    // drained or at this instant, whichever is first.
    let mut leave_by: Option<Instant> = None;
    let mut shutting_down = false;
    let mut drain_check = tokio::time::interval(Duration::from_millis(100));
    let mut idle_check = tokio::time::interval(Duration::from_millis(500));
    // SIGUSR1 moves the connection to a fresh UDP socket (QUIC connection
    // migration), as a NAT that remapped this node would; the migration
    // test sends it mid-task.
    let mut rebind =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()).ok();
    // A farm with a standby (the ticket names several coordinators): a
    // coordinator silent for COORDINATOR_SILENT is taken for gone, so the
    // worker joins the one taking over in seconds, not at QUIC's idle
    // timeout.
    let mut silence = Silence::new(!ticket.also.is_empty(), &conn);
    let mut silence_check = tokio::time::interval(Duration::from_millis(250));
    let result = loop {
        let next = tokio::select! {
            _ = silence_check.tick(), if silence.watching => {
                if silence.gone(&conn) {
                    break Err(anyhow::anyhow!(
                        "the coordinator has not answered for {} s; trying every coordinator the ticket names",
                        COORDINATOR_SILENT.as_secs()
                    ));
                }
                continue;
            }
            Some(()) = async { rebind.as_mut()?.recv().await } => {
                match transport::rebind(&session.endpoint) {
                    Ok(local) => tracing::info!(%local, "SIGUSR1: UDP socket rebound; the connection migrates to it"),
                    Err(e) => tracing::warn!("SIGUSR1: rebinding the UDP socket failed: {e}"),
                }
                continue;
            }
            next = framing::read_frame::<CoordMsg, _>(&mut recv) => next,
            Some((t, outcome)) = held.finished_rx.recv() => {
                // Its files' fetch died with an earlier connection, and this
                // one's coordinator left the task with this worker (it
                // re-adopted it when this worker rejoined): fetch again,
                // here. (Dropped, the task would be held by nobody.)
                let outcome = match outcome {
                    Outcome::Lost(task) if conn.close_reason().is_none() && held.table.is_rendering(t) => {
                        match held.table.job_info(t.job) {
                            Some(job) => {
                                tracing::info!(job = t.job, task = t.index, "fetching the task's files again, over the new connection");
                                let env = task_env(config, cache, &conn, held);
                                start_render(held, env, job, *task);
                                continue;
                            }
                            None => Outcome::Lost(task),
                        }
                    }
                    outcome => outcome,
                };
                if let Some(report) = held.table.finished(t, outcome) {
                    send_report(&conn, &tx, report);
                }
                continue;
            }
            _ = shutdown.wait_for(|&s| s), if !shutting_down => {
                let grace = config.drain_grace.unwrap_or_default();
                tracing::info!(running = held.table.rendering(), grace_ms = grace.as_millis() as u64, "shutting down: handing back leases");
                let _ = tx.send(WorkerMsg::Draining);
                draining = true;
                shutting_down = true;
                // A grace too long for the clock: no leave-by instant.
                if let Some(by) = Instant::now().checked_add(grace) {
                    leave_by = Some(leave_by.map_or(by, |t| t.min(by)));
                }
                continue;
            }
            _ = drain_check.tick(), if draining => {
                if held.table.is_empty() {
                    tracing::info!("drained: every task finished and acknowledged; leaving");
                    break Ok(SessionEnd::Drained);
                }
                if leave_by.is_some_and(|t| Instant::now() >= t) {
                    tracing::info!(handed_back = held.table.len(), "leaving with tasks unfinished; the coordinator requeues them");
                    break Ok(SessionEnd::Drained);
                }
                continue;
            }
            _ = idle_check.tick(), if held.idle.bound().is_some() => {
                if idle_exit_now(held) {
                    break Ok(SessionEnd::Drained);
                }
                continue;
            }
        };
        let msg = match next {
            Ok(Some(msg)) => msg,
            Ok(None) => break Ok(SessionEnd::Closed),
            Err(e) => break Err(anyhow::Error::from(e)),
        };
        if matches!(msg, CoordMsg::Assign(_)) {
            held.idle.work();
        }
        let env = task_env(config, cache, &conn, held);
        if on_message(held, env, &tx, msg) && !draining {
            draining = true;
            held.draining = true;
            leave_by = config
                .drain_grace
                .and_then(|g| Instant::now().checked_add(g));
        }
    };
    heartbeat.abort();
    *held.link.lock().expect("link lock") = None;
    if matches!(result, Ok(SessionEnd::Drained)) {
        held.table.stop_all();
    }
    drop(tx);
    let _ = writer.await;
    if matches!(result, Ok(SessionEnd::Drained)) {
        // Say goodbye so the coordinator frees our leases now.
        conn.close(0u32.into(), b"worker leaving");
        let _ = tokio::time::timeout(Duration::from_secs(2), session.endpoint.wait_idle()).await;
    }
    result
}

/// Says who this worker is and what it holds; returns the heartbeat
/// interval the coordinator asks for.
async fn join(
    config: &Config,
    cache: &Cache,
    held: &Held,
    tx: &mpsc::UnboundedSender<WorkerMsg>,
    recv: &mut quinn::RecvStream,
) -> anyhow::Result<(u64, bool)> {
    let hostname = std::fs::read_to_string("/etc/hostname")
        .unwrap_or_default()
        .trim()
        .to_string();
    tx.send(WorkerMsg::Join(WorkerInfo {
        engines: config.engines.iter().map(|e| e.kind()).collect(),
        slots: config.slots,
        price_per_hour: config.price_per_hour,
        hostname,
        holding: held.table.holding(),
        interruptible: config.interruptible,
        cached: cache.held_digests(),
        blenders: config
            .engines
            .iter()
            .flat_map(|e| e.blender_offers())
            .collect(),
        fetches_builds: config.builds.is_some(),
        draining: held.draining,
        host: Some(Box::new(held.host.clone())),
    }))?;
    let mut first = framing::read_frame::<CoordMsg, _>(recv).await?;
    if let Some(CoordMsg::Enrolled { credential }) = &first {
        identity::save(&config.cache_dir, &config.ticket.fingerprint, credential)?;
        tracing::info!("enrolled: this worker's credential is kept in its cache folder");
        first = framing::read_frame::<CoordMsg, _>(recv).await?;
    }
    match first {
        Some(CoordMsg::Joined {
            worker_id,
            heartbeat_ms,
            lease_ms,
            store_urls,
        }) => {
            tracing::info!(
                worker_id,
                heartbeat_ms,
                lease_ms,
                store_urls,
                holding = held.table.len(),
                "joined the farm"
            );
            Ok((heartbeat_ms, store_urls))
        }
        other => anyhow::bail!("expected Joined, got {other:?}"),
    }
}

/// Heartbeats every `heartbeat_ms` until the connection's writer is gone;
/// telemetry rides along every few seconds, not every beat.
async fn heartbeat(tx: mpsc::UnboundedSender<WorkerMsg>, heartbeat_ms: u64) {
    let mut tick = tokio::time::interval(Duration::from_millis(heartbeat_ms.max(50)));
    let mut sampler = Sampler::new();
    let mut last_sample: Option<Instant> = None;
    loop {
        tick.tick().await;
        let telemetry = if last_sample.is_none_or(|t| t.elapsed() >= TELEMETRY_EVERY) {
            last_sample = Some(Instant::now());
            Some(sampler.sample())
        } else {
            None
        };
        if tx.send(WorkerMsg::Heartbeat { telemetry }).is_err() {
            break;
        }
    }
}

/// What a task started over `conn` runs with.
fn task_env(
    config: &Arc<Config>,
    cache: &Arc<Cache>,
    conn: &quinn::Connection,
    held: &Held,
) -> TaskEnv {
    TaskEnv {
        config: config.clone(),
        cache: cache.clone(),
        conn: conn.clone(),
        link: held.link.clone(),
        finished: held.finished_tx.clone(),
        slots: held.slots.clone(),
    }
}

/// Starts `task`'s render (its files fetched first), held in the table.
fn start_render(held: &mut Held, env: TaskEnv, job: Arc<JobInfo>, task: TaskSpec) {
    let t = task.task;
    let ctl = Arc::new(Control::default());
    // Its place in the slots' order is taken now, at assignment.
    let turn = env.slots.turn();
    let handle = tokio::spawn(run_task(env, job, task, ctl.clone(), turn));
    let render = Render {
        handle: handle.abort_handle(),
        ctl,
    };
    held.table.started(t, render);
}

/// One message from the coordinator, applied to the task table (a render
/// started or stopped, a result acknowledged). Returns true when it asks
/// the worker to drain.
fn on_message(
    held: &mut Held,
    env: TaskEnv,
    tx: &mpsc::UnboundedSender<WorkerMsg>,
    msg: CoordMsg,
) -> bool {
    match msg {
        CoordMsg::Drain => {
            tracing::info!(
                running = held.table.rendering(),
                "asked to drain: finishing running tasks, then leaving"
            );
            return true;
        }
        CoordMsg::Joined { .. } | CoordMsg::Enrolled { .. } => {}
        CoordMsg::Builds(builds) => {
            if let Some(auto) = &env.config.builds {
                auto.set(builds);
            }
        }
        CoordMsg::Job(info) => held.table.job(info),
        CoordMsg::Scan {
            id,
            blend,
            path,
            version,
        } => {
            let tx = tx.clone();
            tokio::spawn(async move {
                let result = farm_scan(&env, blend, &path, version).await;
                if let Err(e) = &result {
                    tracing::warn!(%blend, "farm scan failed: {e:#}");
                }
                let result = result.map_err(|e| format!("{e:#}"));
                let _ = tx.send(WorkerMsg::Scanned { id, result });
            });
        }
        CoordMsg::Assign(task) => {
            let job = match held.table.assign(&task) {
                Ok(job) => job,
                Err(error) => {
                    let _ = tx.send(WorkerMsg::Failed {
                        task: task.task,
                        error,
                        log: String::new(),
                        unsupported: false,
                    });
                    return false;
                }
            };
            start_render(held, env, job, task);
        }
        CoordMsg::Cancel(t) => {
            if held.table.cancel(t) {
                tracing::info!(
                    job = t.job,
                    task = t.index,
                    epoch = t.epoch,
                    "task canceled by the coordinator"
                );
            }
        }
        CoordMsg::Ack {
            task,
            accepted,
            reason,
        } => {
            let failure = held.table.reported_failure(task);
            held.table.ack(task);
            if failure {
                tracing::info!(
                    job = task.job,
                    task = task.index,
                    epoch = task.epoch,
                    "failure recorded"
                );
            } else if accepted {
                tracing::info!(
                    job = task.job,
                    task = task.index,
                    epoch = task.epoch,
                    "result accepted"
                );
            } else {
                tracing::warn!(
                    job = task.job,
                    task = task.index,
                    epoch = task.epoch,
                    "result refused: {}",
                    reason.unwrap_or_default()
                );
            }
        }
    }
    false
}

/// Scans the `.blend` blob `blend` for the farm: fetches that one blob
/// into a folder of its own (not the cache: nothing renders it here) and
/// runs the dependency scan on it in a Blender of the file's series or
/// newer, resolving its paths against the artist's `path`.
async fn farm_scan(
    env: &TaskEnv,
    blend: Digest,
    path: &str,
    version: tessera_protocol::blender::BlenderVersion,
) -> anyhow::Result<String> {
    let engine = (env.config.engines.iter())
        .find(|e| e.kind() == tessera_protocol::job::Engine::Blender)
        .cloned()
        .context("this worker offers no Blender")?;
    let dir = env.config.cache_dir.join("scans").join(blend.to_hex());
    let _ = std::fs::remove_dir_all(&dir);
    let blobs = blob::BlobDir::open(&dir)?;
    let result = async {
        blob::get(&env.conn, blend, None, &blobs)
            .await
            .context("fetching the file to scan")?;
        let file = dir.join("scan.blend");
        std::fs::rename(blobs.path(&blend), &file)?;
        let path = path.to_string();
        tokio::task::spawn_blocking(move || engine.scan(&file, version, &path))
            .await
            .context("the scan thread panicked")?
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}
