//! The worker's connection loop: join with the worker ticket, heartbeat,
//! render what is assigned on as many slots as it offers, upload outputs,
//! and reconnect with backoff and jitter whenever the coordinator goes away.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
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
}

/// Runs until `shutdown` turns true. Returns an error only for problems
/// retrying cannot fix (a refused ticket, a protocol version mismatch).
pub async fn run(config: Config, mut shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    let cache = Arc::new(Cache::open(&config.cache_dir, config.cache_max)?);
    let config = Arc::new(config);
    let mut backoff = Duration::from_millis(200);
    loop {
        let outcome = session(&config, &cache, &mut shutdown, &mut backoff).await;
        match outcome {
            Err(e) => {
                if let Some(t) = e.downcast_ref::<TransportError>() {
                    if matches!(t, TransportError::Refused(_) | TransportError::Version(_)) {
                        return Err(e);
                    }
                }
                tracing::warn!("disconnected from the coordinator: {e:#}");
            }
            Ok(SessionEnd::Drained) => return Ok(()),
            Ok(SessionEnd::Closed) => tracing::warn!("the coordinator closed the connection"),
        }
        let jitter: f64 = rand::random_range(0.5..1.5);
        let wait = backoff.mul_f64(jitter);
        tracing::info!("reconnecting in {} ms", wait.as_millis());
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|&s| s) => return Ok(()),
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

/// One connection, from join to loss. On `shutdown` (SIGTERM, as spot
/// platforms send before preemption) the worker takes no new work, waits up
/// to `drain_grace` for running tasks, then closes the connection so the
/// coordinator requeues what is left at once instead of waiting for leases to
/// expire.
async fn session(
    config: &Arc<Config>,
    cache: &Arc<Cache>,
    shutdown: &mut watch::Receiver<bool>,
    backoff: &mut Duration,
) -> anyhow::Result<SessionEnd> {
    let session = tokio::select! {
        s = transport::connect(&config.ticket, &config.name, Timing::default()) => s?,
        // While connecting there is nothing to hand back.
        _ = shutdown.wait_for(|&s| s) => return Ok(SessionEnd::Drained),
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
        cached: cache.held_digests(),
    }))?;
    let heartbeat_ms = match codec::read_frame::<CoordMsg, _>(&mut recv).await? {
        Some(CoordMsg::Joined {
            worker_id,
            heartbeat_ms,
            lease_ms,
        }) => {
            tracing::info!(worker_id, heartbeat_ms, lease_ms, "joined the farm");
            heartbeat_ms
        }
        other => anyhow::bail!("expected Joined, got {other:?}"),
    };
    *backoff = Duration::from_millis(200);
    cache.reset_jobs();
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
    let unacked = Arc::new(AtomicUsize::new(0));
    let mut draining = false;
    // Set on shutdown: leave when drained or at this instant, whichever is first.
    let mut leave_by: Option<Instant> = None;
    let mut drain_check = tokio::time::interval(Duration::from_millis(100));
    let mut jobs: HashMap<u64, Arc<JobInfo>> = HashMap::new();
    let mut running: HashMap<(u64, u32), (u64, tokio::task::AbortHandle)> = HashMap::new();
    let result = loop {
        let next = tokio::select! {
            next = codec::read_frame::<CoordMsg, _>(&mut recv) => next,
            _ = shutdown.wait_for(|&s| s), if leave_by.is_none() => {
                tracing::info!(running = running.len(), grace_ms = config.drain_grace.as_millis() as u64, "shutting down: handing back leases");
                let _ = tx.send(WorkerMsg::Draining);
                draining = true;
                leave_by = Some(Instant::now() + config.drain_grace);
                continue;
            }
            _ = drain_check.tick(), if draining => {
                running.retain(|_, (_, handle)| !handle.is_finished());
                if running.is_empty() && unacked.load(Ordering::SeqCst) == 0 {
                    tracing::info!("drained: every task finished and acknowledged; leaving");
                    break Ok(SessionEnd::Drained);
                }
                if leave_by.is_some_and(|t| Instant::now() >= t) {
                    tracing::info!(handed_back = running.len(), "leaving with tasks unfinished; the coordinator requeues them");
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
        running.retain(|_, (_, handle)| !handle.is_finished());
        match msg {
            CoordMsg::Drain => {
                tracing::info!(
                    running = running.len(),
                    "asked to drain: finishing running tasks, then leaving"
                );
                draining = true;
            }
            CoordMsg::Joined { .. } => {}
            CoordMsg::Job(info) => {
                jobs.insert(info.job, Arc::new(info));
            }
            CoordMsg::Assign(task) => {
                let Some(job) = jobs.get(&task.task.job).cloned() else {
                    let _ = tx.send(WorkerMsg::Failed {
                        task: task.task,
                        error: "assigned a task of a job this worker was never told about".into(),
                    });
                    continue;
                };
                let key = (task.task.job, task.task.index);
                let epoch = task.task.epoch;
                let handle = tokio::spawn(run_task(
                    config.clone(),
                    cache.clone(),
                    conn.clone(),
                    tx.clone(),
                    unacked.clone(),
                    job,
                    task,
                ));
                running.insert(key, (epoch, handle.abort_handle()));
            }
            CoordMsg::Cancel(t) => {
                if let Some((epoch, handle)) = running.get(&(t.job, t.index)) {
                    if *epoch == t.epoch {
                        tracing::info!(
                            job = t.job,
                            task = t.index,
                            "task canceled by the coordinator"
                        );
                        handle.abort();
                    }
                }
            }
            CoordMsg::Ack {
                task,
                accepted,
                reason,
            } => {
                let _ =
                    unacked.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
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
                        "result refused: {}",
                        reason.unwrap_or_default()
                    );
                }
            }
        }
    };
    heartbeat.abort();
    for (_, (_, handle)) in running {
        handle.abort();
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

async fn run_task(
    config: Arc<Config>,
    cache: Arc<Cache>,
    conn: quinn::Connection,
    tx: mpsc::UnboundedSender<WorkerMsg>,
    unacked: Arc<AtomicUsize>,
    job: Arc<JobInfo>,
    task: TaskSpec,
) {
    let t = task.task;
    let msg = match render_and_upload(&config, &cache, &conn, &tx, &job, &task).await {
        Ok(done) => done,
        Err(e) => {
            tracing::warn!(job = t.job, task = t.index, "task failed: {e:#}");
            WorkerMsg::Failed {
                task: t,
                error: format!("{e:#}"),
            }
        }
    };
    unacked.fetch_add(1, Ordering::SeqCst);
    let _ = tx.send(msg);
}

async fn render_and_upload(
    config: &Config,
    cache: &Cache,
    conn: &quinn::Connection,
    tx: &mpsc::UnboundedSender<WorkerMsg>,
    job: &Arc<JobInfo>,
    task: &TaskSpec,
) -> anyhow::Result<WorkerMsg> {
    let engine = config
        .engines
        .iter()
        .find(|e| e.kind() == job.engine)
        .cloned()
        .with_context(|| format!("this worker does not offer the {} engine", job.engine))?;
    // The job's files stay pinned in the cache until this task is over.
    let files = cache.prepare(conn, job).await?;
    let dir = files.dir().to_path_buf();
    if let Some((added, removed)) = cache.take_changes() {
        let _ = tx.send(WorkerMsg::Cached { added, removed });
    }
    let started = Instant::now();
    let (job2, task2) = (job.clone(), task.clone());
    let (t, progress_tx) = (task.task, tx.clone());
    let last_sent = std::sync::Mutex::new(None::<Instant>);
    // Samples done, at most four reports a second.
    let progress = move |done: u32, total: u32| {
        let mut last = last_sent.lock().expect("progress lock");
        if last.is_none_or(|l| l.elapsed() >= Duration::from_millis(250)) || done == total {
            *last = Some(Instant::now());
            let _ = progress_tx.send(WorkerMsg::Progress {
                task: t,
                done,
                total,
            });
        }
    };
    let output = tokio::task::spawn_blocking(move || engine.render(&job2, &dir, &task2, &progress))
        .await
        .context("the render thread panicked")??;
    let render_ms = started.elapsed().as_millis() as u64;
    let t: TaskRef = task.task;
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
    if output.len() <= MAX_INLINE_OUTPUT {
        return Ok(WorkerMsg::Done {
            task: t,
            output: digest,
            render_ms,
            inline: Some(output),
        });
    }
    blob::put(
        conn,
        digest,
        output.len() as u64,
        BlobSource::Bytes(&output),
    )
    .await
    .context("uploading the output")?;
    Ok(WorkerMsg::Done {
        task: t,
        output: digest,
        render_ms,
        inline: None,
    })
}
