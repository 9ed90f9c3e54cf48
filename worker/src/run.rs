//! The worker's connection loop: join with the worker ticket, heartbeat,
//! render what is assigned on as many slots as it offers, upload outputs,
//! and reconnect with backoff and jitter whenever the coordinator goes away.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use tessera_protocol::blob::{self, BlobSource};
use tessera_protocol::codec;
use tessera_protocol::messages::{
    CoordMsg, JobInfo, TaskRef, TaskSpec, WorkerInfo, WorkerMsg, MAX_INLINE_OUTPUT,
};
use tessera_protocol::ticket::Ticket;
use tessera_protocol::transport::{self, Timing, TransportError};
use tessera_protocol::Digest;
use tokio::sync::{mpsc, watch};

use crate::cache::Cache;
use crate::engine::Engine;
use crate::telemetry::Sampler;

/// How often telemetry rides along with a heartbeat.
const TELEMETRY_EVERY: Duration = Duration::from_secs(5);

pub struct Config {
    pub ticket: Ticket,
    pub name: String,
    pub cache_dir: PathBuf,
    /// Cap on the blob cache's size in bytes (`--cache-max`).
    pub cache_max: Option<u64>,
    pub engines: Vec<Arc<dyn Engine>>,
    pub slots: u32,
    pub price_per_hour: f64,
    /// On shutdown, how long running tasks may take to finish before their
    /// leases are handed back.
    pub drain_grace: Duration,
    /// A spot or interruptible instance (reported to the coordinator).
    pub interruptible: bool,
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
    let config = Arc::new(config);
    let (finished_tx, finished_rx) = mpsc::unbounded_channel();
    let mut held = Held {
        tasks: HashMap::new(),
        jobs: HashMap::new(),
        finished_tx,
        finished_rx,
        link: Arc::new(Mutex::new(None)),
    };
    let mut backoff = Duration::from_millis(200);
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
                    held = held.tasks.len(),
                    "disconnected from the coordinator: {e:#}"
                );
            }
            Ok(SessionEnd::Drained) => return Ok(()),
            Ok(SessionEnd::Closed) => tracing::warn!(
                held = held.tasks.len(),
                "the coordinator closed the connection"
            ),
        }
        let jitter: f64 = rand::random_range(0.5..1.5);
        let wait = backoff.mul_f64(jitter);
        tracing::info!("reconnecting in {} ms", wait.as_millis());
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|&s| s) => {
                held.abort_all();
                return Ok(());
            }
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// How a session ended without an error.
enum SessionEnd {
    /// The coordinator closed the connection: reconnect.
    Closed,
    /// Asked to drain, and done: leave.
    Drained,
}

/// The tasks this worker holds, across connections.
struct Held {
    tasks: HashMap<(u64, u32), HeldTask>,
    /// The jobs of tasks it was given, as the coordinator described them.
    jobs: HashMap<u64, Arc<JobInfo>>,
    /// Render tasks report here when they end.
    finished_tx: mpsc::UnboundedSender<(TaskRef, Outcome)>,
    finished_rx: mpsc::UnboundedReceiver<(TaskRef, Outcome)>,
    /// The current connection's outgoing messages, for progress reports
    /// from renders that started over an earlier one.
    link: Link,
}

type Link = Arc<Mutex<Option<mpsc::UnboundedSender<WorkerMsg>>>>;

struct HeldTask {
    epoch: u64,
    state: TaskState,
}

enum TaskState {
    /// Its render task, and the flag that stops the engine early.
    Rendering(tokio::task::AbortHandle, Arc<AtomicBool>),
    /// Rendered or failed; sent until the coordinator acknowledges it.
    Finished(Arc<Report>),
}

/// A finished task's report, with the output to upload first when it is
/// too large to ride inline.
struct Report {
    msg: WorkerMsg,
    upload: Option<Vec<u8>>,
}

/// What a render task came to.
enum Outcome {
    Report(Report),
    /// The connection it fetched its files over went away before the
    /// render could start: there is nothing to report.
    Lost,
}

impl Held {
    /// The tasks to name when joining.
    fn refs(&self) -> Vec<TaskRef> {
        let mut refs: Vec<TaskRef> = (self.tasks.iter())
            .map(|(&(job, index), t)| TaskRef {
                job,
                index,
                epoch: t.epoch,
            })
            .collect();
        refs.sort_by_key(|t| (t.job, t.index));
        refs
    }

    /// Removes the task if it is held under `epoch`; stops its render.
    fn drop_task(&mut self, t: TaskRef) -> bool {
        let key = (t.job, t.index);
        if self.tasks.get(&key).is_none_or(|h| h.epoch != t.epoch) {
            return false;
        }
        if let Some(HeldTask {
            state: TaskState::Rendering(handle, canceled),
            ..
        }) = self.tasks.remove(&key)
        {
            canceled.store(true, Ordering::Relaxed);
            handle.abort();
        }
        true
    }

    fn abort_all(&mut self) {
        for (_, task) in self.tasks.drain() {
            if let TaskState::Rendering(handle, canceled) = task.state {
                canceled.store(true, Ordering::Relaxed);
                handle.abort();
            }
        }
    }

    fn rendering(&self) -> usize {
        (self.tasks.values())
            .filter(|t| matches!(t.state, TaskState::Rendering(..)))
            .count()
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
async fn session(
    config: &Arc<Config>,
    cache: &Arc<Cache>,
    held: &mut Held,
    shutdown: &mut watch::Receiver<bool>,
    backoff: &mut Duration,
) -> anyhow::Result<SessionEnd> {
    let session = tokio::select! {
        s = transport::connect(&config.ticket, &config.name, Timing::default()) => s?,
        // While connecting there is nothing to hand back.
        _ = shutdown.wait_for(|&s| s) => {
            held.abort_all();
            return Ok(SessionEnd::Drained);
        }
    };
    let conn = session.connection.clone();
    let (mut send, mut recv) = session.control.split();
    let (tx, mut rx) = mpsc::unbounded_channel::<WorkerMsg>();
    let writer = tokio::spawn(async move {
        while let Some(msg) = rx.recv().await {
            if codec::write_frame(&mut send, &msg).await.is_err() {
                break;
            }
        }
    });
    let hostname = std::fs::read_to_string("/etc/hostname")
        .unwrap_or_default()
        .trim()
        .to_string();
    tx.send(WorkerMsg::Join(WorkerInfo {
        engines: config.engines.iter().map(|e| e.kind()).collect(),
        slots: config.slots,
        price_per_hour: config.price_per_hour,
        hostname,
        holding: held.refs(),
        interruptible: config.interruptible,
        cached: cache.held_digests(),
    }))?;
    let heartbeat_ms = match codec::read_frame::<CoordMsg, _>(&mut recv).await? {
        Some(CoordMsg::Joined {
            worker_id,
            heartbeat_ms,
            lease_ms,
        }) => {
            tracing::info!(
                worker_id,
                heartbeat_ms,
                lease_ms,
                holding = held.tasks.len(),
                "joined the farm"
            );
            heartbeat_ms
        }
        other => anyhow::bail!("expected Joined, got {other:?}"),
    };
    *backoff = Duration::from_millis(200);
    cache.reset_jobs();
    *held.link.lock().expect("link lock") = Some(tx.clone());
    // Results finished before this connection: send them again.
    for task in held.tasks.values() {
        if let TaskState::Finished(report) = &task.state {
            send_report(&conn, &tx, report.clone());
        }
    }
    let heartbeat = {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(heartbeat_ms.max(50)));
            let mut sampler = Sampler::new();
            let mut last_sample: Option<Instant> = None;
            loop {
                tick.tick().await;
                // Telemetry rides along every few seconds, not every beat.
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
        })
    };
    let mut draining = false;
    // Set on shutdown: leave when drained or at this instant, whichever is first.
    let mut leave_by: Option<Instant> = None;
    let mut drain_check = tokio::time::interval(Duration::from_millis(100));
    let result = loop {
        let next = tokio::select! {
            next = codec::read_frame::<CoordMsg, _>(&mut recv) => next,
            Some((t, outcome)) = held.finished_rx.recv() => {
                let key = (t.job, t.index);
                if held.tasks.get(&key).is_none_or(|h| h.epoch != t.epoch) {
                    continue; // canceled meanwhile
                }
                match outcome {
                    Outcome::Lost => {
                        held.tasks.remove(&key);
                    }
                    Outcome::Report(report) => {
                        let report = Arc::new(report);
                        send_report(&conn, &tx, report.clone());
                        held.tasks.insert(key, HeldTask { epoch: t.epoch, state: TaskState::Finished(report) });
                    }
                }
                continue;
            }
            _ = shutdown.wait_for(|&s| s), if leave_by.is_none() => {
                tracing::info!(running = held.rendering(), grace_ms = config.drain_grace.as_millis() as u64, "shutting down: handing back leases");
                let _ = tx.send(WorkerMsg::Draining);
                draining = true;
                leave_by = Some(Instant::now() + config.drain_grace);
                continue;
            }
            _ = drain_check.tick(), if draining => {
                if held.tasks.is_empty() {
                    tracing::info!("drained: every task finished and acknowledged; leaving");
                    break Ok(SessionEnd::Drained);
                }
                if leave_by.is_some_and(|t| Instant::now() >= t) {
                    tracing::info!(handed_back = held.tasks.len(), "leaving with tasks unfinished; the coordinator requeues them");
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
        match msg {
            CoordMsg::Drain => {
                tracing::info!(
                    running = held.rendering(),
                    "asked to drain: finishing running tasks, then leaving"
                );
                draining = true;
            }
            CoordMsg::Joined { .. } => {}
            CoordMsg::Job(info) => {
                held.jobs.insert(info.job, Arc::new(info));
            }
            CoordMsg::Assign(task) => {
                let Some(job) = held.jobs.get(&task.task.job).cloned() else {
                    let _ = tx.send(WorkerMsg::Failed {
                        task: task.task,
                        error: "assigned a task of a job this worker was never told about".into(),
                        log: String::new(),
                        unsupported: false,
                    });
                    continue;
                };
                let t = task.task;
                // A task assigned again replaces the attempt it had here.
                if let Some(old) = held.tasks.get(&(t.job, t.index)) {
                    let old = TaskRef {
                        epoch: old.epoch,
                        ..t
                    };
                    held.drop_task(old);
                }
                let canceled = Arc::new(AtomicBool::new(false));
                let env = TaskEnv {
                    config: config.clone(),
                    cache: cache.clone(),
                    conn: conn.clone(),
                    link: held.link.clone(),
                    finished: held.finished_tx.clone(),
                };
                let handle = tokio::spawn(run_task(env, job, task, canceled.clone()));
                held.tasks.insert(
                    (t.job, t.index),
                    HeldTask {
                        epoch: t.epoch,
                        state: TaskState::Rendering(handle.abort_handle(), canceled),
                    },
                );
            }
            CoordMsg::Cancel(t) => {
                if held.drop_task(t) {
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
                let key = (task.job, task.index);
                if held.tasks.get(&key).is_some_and(|h| h.epoch == task.epoch) {
                    held.tasks.remove(&key);
                }
                if accepted {
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
    };
    heartbeat.abort();
    *held.link.lock().expect("link lock") = None;
    if matches!(result, Ok(SessionEnd::Drained)) {
        held.abort_all();
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

/// What a render task needs from the worker around it.
struct TaskEnv {
    config: Arc<Config>,
    cache: Arc<Cache>,
    /// The connection it was assigned over, to fetch the job's files.
    conn: quinn::Connection,
    link: Link,
    finished: mpsc::UnboundedSender<(TaskRef, Outcome)>,
}

async fn run_task(env: TaskEnv, job: Arc<JobInfo>, task: TaskSpec, canceled: Arc<AtomicBool>) {
    let TaskEnv {
        config,
        cache,
        conn,
        link,
        finished,
    } = env;
    let t = task.task;
    let outcome = match render(&config, &cache, &conn, link, &job, &task, canceled).await {
        Ok(report) => Outcome::Report(report),
        Err(e) if matches!(e, RenderError::Fetch(_)) && conn.close_reason().is_some() => {
            tracing::warn!(
                job = t.job,
                task = t.index,
                "connection lost while fetching the job's files: {e:#}"
            );
            Outcome::Lost
        }
        Err(e) => {
            let failure = match &e {
                RenderError::Render(e) => e.downcast_ref::<crate::engine::Failure>(),
                RenderError::Fetch(_) => None,
            };
            let log = failure.map(|f| tessera_protocol::messages::log_tail(&f.log).to_string());
            let unsupported = failure.is_some_and(|f| f.unsupported);
            let e = anyhow::Error::from(e);
            tracing::warn!(job = t.job, task = t.index, "task failed: {e:#}");
            Outcome::Report(Report {
                msg: WorkerMsg::Failed {
                    task: t,
                    error: format!("{e:#}"),
                    log: log.unwrap_or_default(),
                    unsupported,
                },
                upload: None,
            })
        }
    };
    let _ = finished.send((t, outcome));
}

#[derive(Debug, thiserror::Error)]
enum RenderError {
    #[error("{0:#}")]
    Fetch(anyhow::Error),
    #[error("{0:#}")]
    Render(anyhow::Error),
}

async fn render(
    config: &Config,
    cache: &Cache,
    conn: &quinn::Connection,
    link: Link,
    job: &Arc<JobInfo>,
    task: &TaskSpec,
    canceled: Arc<AtomicBool>,
) -> Result<Report, RenderError> {
    let engine = config
        .engines
        .iter()
        .find(|e| e.kind() == job.engine)
        .cloned()
        .with_context(|| format!("this worker does not offer the {} engine", job.engine))
        .map_err(RenderError::Render)?;
    // The job's files stay pinned in the cache until this task is over.
    let files = cache.prepare(conn, job).await.map_err(RenderError::Fetch)?;
    let dir = files.dir().to_path_buf();
    if let Some((added, removed)) = cache.take_changes() {
        // With no connection now, the next join reports the whole cache.
        if let Some(tx) = link.lock().expect("link lock").as_ref() {
            let _ = tx.send(WorkerMsg::Cached { added, removed });
        }
    }
    let started = Instant::now();
    let (job2, task2) = (job.clone(), task.clone());
    let t = task.task;
    let last_sent = std::sync::Mutex::new(None::<Instant>);
    // Samples done, at most four reports a second, on whichever connection
    // is current.
    let progress = move |done: u32, total: u32| {
        let mut last = last_sent.lock().expect("progress lock");
        if last.is_none_or(|l| l.elapsed() >= Duration::from_millis(250)) || done == total {
            *last = Some(Instant::now());
            if let Some(tx) = link.lock().expect("link lock").as_ref() {
                let _ = tx.send(WorkerMsg::Progress {
                    task: t,
                    done,
                    total,
                });
            }
        }
    };
    // The engine stops early once the task is canceled: the blocking thread
    // is not left rendering what nobody wants while the slot takes new work.
    let output = tokio::task::spawn_blocking(move || {
        engine.render(&job2, &dir, &task2, &progress, &canceled)
    })
    .await
    .context("the render thread panicked")
    .and_then(|r| r)
    .map_err(RenderError::Render)?;
    let render_ms = started.elapsed().as_millis() as u64;
    tracing::info!(
        job = t.job,
        task = t.index,
        frame = task.frame,
        x = task.tile.x,
        y = task.tile.y,
        render_ms,
        "task rendered"
    );
    let digest = Digest::of(&output);
    let inline = output.len() <= MAX_INLINE_OUTPUT;
    let (inline, upload) = if inline {
        (Some(output), None)
    } else {
        (None, Some(output))
    };
    Ok(Report {
        msg: WorkerMsg::Done {
            task: t,
            output: digest,
            render_ms,
            inline,
        },
        upload,
    })
}
