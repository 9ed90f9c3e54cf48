//! The operations clients call — submit, status, cancel, pause, resume,
//! retry, drain, logs, frames, tiles, events — as one typed service under
//! both APIs: a QUIC client session (`conn::client`) and the HTTP API
//! (`http`) call these and only translate. Each answer is a value or a
//! [`ClientError`] whose [`ErrorKind`] QUIC carries on the wire and HTTP
//! maps to its status code; no caller reads the message to decide anything.
//!
//! | kind | when | HTTP |
//! |---|---|---|
//! | `NotFound` | no such job, worker or frame | 404 |
//! | `Conflict` | the job's state forbids it (cancel of a finished job, pause of one, retry of one that did not fail; a reused request id) | 409 |
//! | `Invalid` | the request is wrong (a spec out of bounds, a file not uploaded, a filter too large) | 400 |
//! | `Unauthorized` | a wrong secret (the HTTP layer's and the handshake's) | 401 |
//! | `Unavailable` | the farm cannot now (no worker to ask) | 503 |
//! | `Internal` | the database or the store failed | 500 |

use std::collections::HashSet;
use std::sync::Arc;

use tessera_protocol::job::JobSpec;
use tessera_protocol::messages::{
    take_page, ClientError, ErrorKind, FarmEvent, FleetReport, FrameOutput, JobDetail, JobFilter,
    JobState, JobStatus, TaskLog, TileState, TileStatus, WorkerDetail, WorkerStatus, PAGE_ITEMS,
};
use tokio::sync::broadcast;

use crate::db::StoredFrame;
use crate::identity::Access;
use crate::server::Shared;

/// A service answer: the value, or why not.
pub(crate) type Answer<T> = Result<T, ClientError>;

/// The coordinator's own failure (database, store, a task that panicked):
/// `Internal`, with its chain of causes.
pub(crate) fn internal(e: impl Into<anyhow::Error>) -> ClientError {
    ClientError::internal(format!("{:#}", e.into()))
}

fn no_job(id: u64) -> ClientError {
    ClientError::not_found(format!("no job {id} on this coordinator"))
}

/// A blocking-pool task that did not finish (it panicked).
fn joined(e: tokio::task::JoinError) -> ClientError {
    ClientError::internal(format!("the request's task failed: {e}"))
}

/// Runs a service call on the blocking pool and waits for it: the calls
/// that read or write the database (or may record a job's end) never run
/// on a runtime thread, where a slow disk would stall every connection.
/// Both APIs call the synchronous operations below through this.
pub(crate) async fn off_runtime<T: Send + 'static>(
    shared: &Arc<Shared>,
    f: impl FnOnce(&Arc<Shared>) -> Answer<T> + Send + 'static,
) -> Answer<T> {
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || f(&shared))
        .await
        .map_err(joined)?
}

/// Validates and records a job (see [`crate::submit::submit`]). On the
/// blocking pool: it waits for a garbage collection under way, checks
/// stored files and writes the database.
pub(crate) async fn submit(
    shared: &Arc<Shared>,
    spec: tessera_protocol::job::JobSpec,
    uploaded: u64,
) -> Answer<JobStatus> {
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || {
        let _gc = crate::server::relock(&shared.gc);
        crate::submit::submit(&shared, spec, uploaded)
    })
    .await
    .map_err(joined)?
}

/// Puts a failed job back in the queue (see [`crate::retry::retry`]), on
/// the blocking pool as a submit is.
pub(crate) async fn retry(shared: &Arc<Shared>, id: u64) -> Answer<JobStatus> {
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || crate::retry::retry(&shared, id))
        .await
        .map_err(joined)?
}

/// One job's status: `NotFound` when there is no such job.
pub(crate) fn job(shared: &Shared, id: u64) -> Answer<JobStatus> {
    shared.job_status(id).map_err(internal)?.ok_or(no_job(id))
}

/// Every job and worker (`Status(None)`, which older clients ask).
pub(crate) fn status(shared: &Shared) -> Answer<(Vec<JobStatus>, Vec<WorkerStatus>)> {
    let snapshot = shared.snapshot(u32::MAX).map_err(internal)?;
    Ok((snapshot.jobs, snapshot.workers))
}

/// The connected workers.
pub(crate) fn workers(shared: &Shared) -> Vec<WorkerStatus> {
    shared.read(|core, now| core.worker_statuses(now))
}

/// One page of every job (active ones from the core, the rest from the
/// database) and of the connected workers; `true` when either goes on.
pub(crate) fn status_page(
    shared: &Shared,
    after_job: u64,
    after_worker: u64,
) -> Answer<(Vec<JobStatus>, Vec<WorkerStatus>, bool)> {
    let stored = (shared.db().jobs_page(after_job, PAGE_ITEMS as u32 + 1)).map_err(internal)?;
    let more_stored = stored.len() > PAGE_ITEMS;
    let (jobs, workers) = shared.read(|core, now| {
        let jobs: Vec<JobStatus> = (stored.iter())
            .map(|j| core.job_status(j.id, now).unwrap_or_else(|| j.status()))
            .collect();
        let mut workers = core.worker_statuses(now);
        workers.retain(|w| w.id > after_worker);
        (jobs, workers)
    });
    let (jobs, more_jobs) = take_page(jobs);
    let (workers, more_workers) = take_page(workers);
    Ok((jobs, workers, more_jobs || more_stored || more_workers))
}

/// One page of the jobs `filter` matches (see [`crate::query::jobs_page`]);
/// a filter too large to be a reasonable question is `Invalid`.
pub(crate) fn jobs_page(
    shared: &Shared,
    filter: &JobFilter,
    after: u64,
) -> Answer<(Vec<JobStatus>, Option<u64>)> {
    filter.check().map_err(ClientError::invalid)?;
    crate::query::jobs_page(shared, filter, after).map_err(internal)
}

/// One page of the jobs `filter` keeps, newest first, and how many it
/// keeps in all (`GET /v1/jobs?limit=…&offset=…`).
pub(crate) fn jobs_window(
    shared: &Shared,
    filter: &JobFilter,
    offset: usize,
    limit: usize,
) -> Answer<(Vec<JobStatus>, u64)> {
    filter.check().map_err(ClientError::invalid)?;
    crate::query::jobs_window(shared, filter, offset, limit).map_err(internal)
}

/// `status JOB`'s detail.
pub(crate) fn detail(shared: &Shared, id: u64) -> Answer<JobDetail> {
    panic_if_asked(shared, id);
    (crate::query::job_detail(shared, id).map_err(internal)?).ok_or(no_job(id))
}

/// Cancels an active job; a finished one (done, failed or canceled) is a
/// `Conflict` and stays as it was.
pub(crate) fn cancel(shared: &Arc<Shared>, id: u64) -> Answer<JobStatus> {
    match shared.act(|core, now| core.cancel(id, now)) {
        (Some(_), Err(e)) => Err(internal(e.context("cannot record the cancel"))),
        (Some(status), Ok(())) => Ok(status),
        (None, _) => {
            let status = job(shared, id)?;
            Err(ClientError::conflict(format!(
                "job {id} is {} already: only a queued or running job can be canceled",
                status.state.name()
            )))
        }
    }
}

/// Pauses (or resumes) an active job; a finished one is a `Conflict`.
pub(crate) fn pause(shared: &Arc<Shared>, id: u64, paused: bool) -> Answer<()> {
    match shared.act(|core, now| core.pause(id, paused, now)) {
        // Not answered done unless it is on disk: a restart keeps it.
        (true, Err(e)) => return Err(internal(e.context("cannot record the pause"))),
        (true, Ok(())) => return Ok(()),
        (false, _) => {}
    }
    let status = job(shared, id)?;
    Err(ClientError::conflict(format!(
        "job {id} is {}: only a queued or running job can be {}",
        status.state.name(),
        if paused { "paused" } else { "resumed" }
    )))
}

/// Gives a queued or running job a new priority (higher goes first),
/// recorded before it is answered.
pub(crate) fn set_priority(shared: &Arc<Shared>, id: u64, priority: i32) -> Answer<JobStatus> {
    match shared.act(|core, _| core.set_priority(id, priority)) {
        (true, Err(e)) => return Err(internal(e.context("cannot record the priority"))),
        (true, Ok(())) => return job(shared, id),
        (false, _) => {}
    }
    let status = job(shared, id)?;
    Err(ClientError::conflict(format!(
        "job {id} is {}: only a queued or running job's priority can change",
        status.state.name(),
    )))
}

/// Asks a connected worker to finish its tasks and leave.
pub(crate) fn drain(shared: &Arc<Shared>, worker: u64) -> Answer<()> {
    if shared.update(|core, _| core.drain(worker)) {
        Ok(())
    } else {
        Err(ClientError::not_found(format!(
            "no worker {worker} is connected"
        )))
    }
}

/// One connected worker in detail: its tasks, telemetry history,
/// blocklists and quarantine.
pub(crate) fn worker(shared: &Shared, worker: u64) -> Answer<WorkerDetail> {
    shared
        .read(|core, now| core.worker_detail(worker, now))
        .ok_or_else(|| ClientError::not_found(format!("no worker {worker} is connected")))
}

/// Revokes every identity enrolled as `name` and closes their connections,
/// answering (identities revoked, connections closed) once their sessions
/// have ended (their leases are back in the queue) or a heartbeat has
/// passed.
pub(crate) async fn revoke(shared: &Arc<Shared>, name: String) -> Answer<(u32, u32)> {
    let asked = name.clone();
    let ids = off_runtime(shared, move |s| {
        let db = s.db();
        crate::identity::revoke(db.sql(), &asked, crate::server::unix_ms())
            .map_err(|e| internal(anyhow::anyhow!("cannot revoke `{asked}`: {e}")))
    })
    .await?;
    if ids.is_empty() {
        return Err(ClientError::not_found(format!(
            "no worker was ever enrolled as `{name}`"
        )));
    }
    let within = std::time::Duration::from_millis(shared.config.heartbeat_ms);
    let disconnected = shared.identities.disconnect(&ids, within).await;
    tracing::warn!(%name, identities = ids.len(), disconnected, "worker revoked");
    Ok((ids.len() as u32, disconnected))
}

/// Revokes the identity of connected worker `worker` (every worker
/// enrolled under its name, as `tessera worker revoke NAME` does).
pub(crate) async fn revoke_connected(
    shared: &Arc<Shared>,
    worker: u64,
) -> Answer<(String, u32, u32)> {
    let Some(name) = shared.read(|core, _| core.worker_name(worker)) else {
        return Err(ClientError::not_found(format!(
            "no worker {worker} is connected"
        )));
    };
    let (identities, disconnected) = revoke(shared, name.clone()).await?;
    Ok((name, identities, disconnected))
}

/// Keeps a fleet's report (the latest replaces the one before), once its
/// counts, figures and names are within bounds.
pub(crate) fn fleet_report(shared: &Shared, report: FleetReport) -> Answer<()> {
    report.check().map_err(ClientError::invalid)?;
    *crate::shared::relock(&shared.fleet) = Some((crate::server::unix_ms(), report));
    Ok(())
}

/// The latest fleet report and when it came; `NotFound` when no fleet
/// reported since the coordinator started.
pub(crate) fn fleet(shared: &Shared) -> Answer<(u64, FleetReport)> {
    (crate::shared::relock(&shared.fleet).clone()).ok_or_else(|| {
        ClientError::not_found("no fleet has reported to this coordinator since it started")
    })
}

/// `NotFound` unless the database holds job `id`.
fn known_job(shared: &Shared, id: u64) -> Answer<()> {
    match shared.db().job_state(id).map_err(internal)? {
        Some(_) => Ok(()),
        None => Err(no_job(id)),
    }
}

/// The logs of a job's failed attempts (of one task, or all).
pub(crate) fn logs(shared: &Shared, job: u64, task: Option<u32>) -> Answer<Vec<TaskLog>> {
    known_job(shared, job)?;
    shared.db().task_logs(job, task).map_err(internal)
}

/// One page of those logs, and the cursor of the next.
pub(crate) fn logs_page(
    shared: &Shared,
    job: u64,
    task: Option<u32>,
    after: u64,
) -> Answer<(Vec<TaskLog>, Option<u64>)> {
    known_job(shared, job)?;
    let rows = (shared.db())
        .task_logs_page(job, task, after, PAGE_ITEMS as u32 + 1)
        .map_err(internal)?;
    let (page, cut) = take_page(rows);
    let next = (cut || page.len() > PAGE_ITEMS)
        .then(|| page.last().map(|(cursor, _)| *cursor))
        .flatten();
    Ok((page.into_iter().map(|(_, l)| l).collect(), next))
}

/// A job's spec: from the core while the job is active (no database read,
/// whatever its size), from the database once it is finished.
fn spec_of(shared: &Shared, id: u64) -> Answer<Arc<JobSpec>> {
    if let Some(spec) = shared.read(|core, _| core.spec(id)) {
        return Ok(spec);
    }
    let stored = shared.db().job(id).map_err(internal)?;
    stored.map(|j| Arc::new(j.spec)).ok_or_else(|| no_job(id))
}

/// Stored frames as clients see them: named as the job names its files.
fn frame_outputs(
    spec: &JobSpec,
    frames: impl IntoIterator<Item = StoredFrame>,
) -> Vec<FrameOutput> {
    let (format, template) = (spec.output, spec.output_name.as_deref());
    // Unreal frames are named as Movie Render Queue names them.
    // An encode job's one output is the movie, under its own name.
    let name = |frame: u32| match &spec.unreal {
        Some(u) => Some(u.frame_file_name(&spec.frames, frame, format)),
        None if spec.encode.is_some() => template.map(str::to_string),
        None => template.and_then(|t| tessera_protocol::job::frame_file_name(t, frame)),
    };
    (frames.into_iter())
        .map(|f| FrameOutput {
            frame: f.frame,
            digest: f.digest,
            size: f.size,
            format,
            name: name(f.frame),
        })
        .collect()
}

/// A job's stitched frames so far.
pub(crate) fn frames(shared: &Shared, id: u64) -> Answer<Vec<FrameOutput>> {
    let spec = spec_of(shared, id)?;
    let frames = shared.db().frames(id).map_err(internal)?;
    Ok(frame_outputs(&spec, frames))
}

/// The frames of a job stitched after the cursor `after` (0 first), at
/// most a page, in the order they were stitched; the cursor to ask with
/// next (`after` when nothing is new), and whether more are waiting. The
/// database reads only the new rows (see [`crate::db::Db::frames_since`]),
/// so `wait` costs O(new frames) per poll on a job of any size.
pub(crate) fn new_frames(
    shared: &Shared,
    id: u64,
    after: u64,
) -> Answer<(Vec<FrameOutput>, u64, bool)> {
    let spec = spec_of(shared, id)?;
    let rows = (shared.db())
        .frames_since(id, after, PAGE_ITEMS as u32 + 1)
        .map_err(internal)?;
    let cursors: Vec<u64> = rows.iter().map(|(cursor, _)| *cursor).collect();
    let named = frame_outputs(&spec, rows.into_iter().map(|(_, f)| f));
    let (page, more) = take_page(cursors.into_iter().zip(named));
    let next = page.last().map_or(after, |(cursor, _)| *cursor);
    Ok((page.into_iter().map(|(_, f)| f).collect(), next, more))
}

/// One page of a job's stitched frames after `after`, and the cursor of
/// the next.
pub(crate) fn frames_page(
    shared: &Shared,
    id: u64,
    after: Option<u32>,
) -> Answer<(Vec<FrameOutput>, Option<u32>)> {
    let rest = (frames(shared, id)?)
        .into_iter()
        .filter(|f| after.is_none_or(|a| f.frame > a));
    let (frames, more) = take_page(rest);
    let next = more.then(|| frames.last().map(|f| f.frame)).flatten();
    Ok((frames, next))
}

/// One stitched frame of a job: `NotFound` for no such job, or a frame
/// not stitched (yet).
pub(crate) fn frame(shared: &Shared, job: u64, frame: u32) -> Answer<FrameOutput> {
    (frames(shared, job)?.into_iter().find(|f| f.frame == frame)).ok_or_else(|| {
        ClientError::not_found(format!("frame {frame} of job {job} is not stitched (yet)"))
    })
}

/// What a tile's preview is made of: the first accepted result of the
/// tile's tasks (one sample range of it, when it has several), and the
/// frame's resolution (which sets the preview's scale).
pub(crate) fn tile_source(
    shared: &Shared,
    job: u64,
    frame: u32,
    tile: u32,
) -> Answer<(tessera_protocol::Digest, (u32, u32))> {
    let spec = spec_of(shared, job)?;
    let Some(pos) = spec.frames.iter().position(|&f| f == frame) else {
        return Err(ClientError::not_found(format!(
            "job {job} does not render frame {frame}"
        )));
    };
    if tile >= spec.tiles.count() {
        return Err(ClientError::not_found(format!(
            "frame {frame} of job {job} has {} tiles: there is no tile {tile}",
            spec.tiles.count()
        )));
    }
    let first = pos as u32 * spec.tasks_per_frame() + tile * spec.sample_ranges;
    let done = (shared.db())
        .result_range(job, first, spec.sample_ranges)
        .map_err(internal)?;
    match done.first() {
        Some(&digest) => Ok((digest, spec.resolution)),
        None => Err(ClientError::not_found(format!(
            "tile {tile} of frame {frame} of job {job} is not rendered (yet)"
        ))),
    }
}

/// Every tile of one frame, for the mosaic: from the core while the job is
/// active, from the database once it is finished.
pub(crate) fn tiles(shared: &Shared, job: u64, frame: u32) -> Answer<Vec<TileStatus>> {
    if let Ok(tiles) = shared.read(|core, _| core.tiles(job, frame)) {
        return Ok(tiles);
    }
    let Some(stored) = shared.db().job(job).map_err(internal)? else {
        return Err(no_job(job));
    };
    let spec = &stored.spec;
    let Some(pos) = spec.frames.iter().position(|&f| f == frame) else {
        return Err(ClientError::not_found(format!(
            "job {job} does not render frame {frame}"
        )));
    };
    let first_of = |pos: u32| pos * spec.tasks_per_frame();
    let per_frame = spec.tiles.count() * spec.sample_ranges;
    let first = first_of(pos as u32);
    let done: HashSet<u32> = (shared.db().results(job).map_err(internal)?.into_iter())
        .map(|r| r.index)
        .filter(|i| (first..first + per_frame).contains(i))
        .collect();
    let (w, h) = spec.resolution;
    Ok((0..spec.tiles.count())
        .map(|tile| {
            let tasks = first + tile * spec.sample_ranges..first + (tile + 1) * spec.sample_ranges;
            let state =
                if stored.state == JobState::Done || tasks.clone().all(|i| done.contains(&i)) {
                    TileState::Done
                } else if stored.state == JobState::Failed {
                    TileState::Failed
                } else {
                    TileState::Queued
                };
            TileStatus {
                tile: spec.tiles.rect(tile, w, h),
                state,
            }
        })
        .collect())
}

/// A farm scan of an uploaded `.blend` on a worker whose Blender can read
/// it (see `conn::scan`): the worker's name and its answer. `Unavailable`
/// when no worker can, or the one asked left or did not answer in time.
pub(crate) async fn scan(
    shared: &Arc<Shared>,
    blend: tessera_protocol::Digest,
    path: String,
    version: tessera_protocol::blender::BlenderVersion,
) -> Answer<(String, String)> {
    crate::conn::scan::scan(shared, blend, path, version).await
}

/// What `secret` may do: the client ticket's current one acts, the viewer
/// ticket's looks (compared in constant time); `Unauthorized` when it is
/// missing or neither. The HTTP API asks this of every request with a
/// bearer; a QUIC client proved its ticket in its hello.
pub(crate) fn authorize(shared: &Shared, secret: Option<&str>) -> Answer<Access> {
    match secret.and_then(|s| shared.identities.http_access(s)) {
        Some(access) => Ok(access),
        None => Err(ClientError::new(
            ErrorKind::Unauthorized,
            "missing or wrong bearer secret: send `Authorization: Bearer SECRET`, SECRET being the client (or viewer) ticket's secret= part",
        )),
    }
}

/// Every farm event from now on (a slow reader lags, never blocks).
pub(crate) fn events(shared: &Shared) -> broadcast::Receiver<(u64, FarmEvent)> {
    shared.events()
}

/// Failpoint (see `commit::FAILPOINT`): a request for the status of job
/// `u64::MAX` panics this connection's handler while it holds the core's
/// lock, for the test that shows one handler's panic stops nothing else.
pub const FAILPOINT_PANIC_IN_HANDLER: &str = "panic-in-handler";

/// The failpoint [`FAILPOINT_PANIC_IN_HANDLER`]: asked about job
/// `u64::MAX`, the handler panics while it holds the farm core's lock.
pub(crate) fn panic_if_asked(shared: &Shared, job: u64) {
    if job == u64::MAX
        && std::env::var(crate::commit::FAILPOINT).as_deref() == Ok(FAILPOINT_PANIC_IN_HANDLER)
    {
        shared
            .read(|_, _| panic!("failpoint: a panic in a connection handler, under the core lock"));
    }
}

#[cfg(test)]
mod tests {
    //! The service on a real database and blob folder, without a socket:
    //! every error kind it answers, and what each refusal leaves as it was.

    use std::collections::BTreeSet;
    use std::path::PathBuf;

    use tessera_protocol::blender::BlenderVersion;
    use tessera_protocol::job::{Engine, JobSpec, ManifestEntry};
    use tessera_protocol::messages::{Role, MAX_FILTER_IDS};
    use tessera_protocol::ticket::Ticket;
    use tessera_protocol::Digest;
    use tessera_store::blob::BlobDir;
    use tessera_store::{BlobStore, Verified};

    use super::*;
    use crate::config::Config;
    use crate::db::Db;
    use crate::farm::{FarmConfig, FarmCore};
    use crate::identity::Identities;
    use crate::scheduler;

    /// A farm's shared handle on a fresh data dir, with no socket, no
    /// worker, and its commit and stitch inboxes held (and unread).
    struct Farm {
        shared: Arc<Shared>,
        secret: String,
        dir: PathBuf,
        _inboxes: (
            tokio::sync::mpsc::UnboundedReceiver<crate::commit::CommitMsg>,
            tokio::sync::mpsc::UnboundedReceiver<crate::stitcher::StitchMsg>,
        ),
    }

    impl Drop for Farm {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn farm(tag: &str) -> Farm {
        let dir =
            std::env::temp_dir().join(format!("tessera-service-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let db = Db::open(&dir.join("state.sqlite")).unwrap();
        let store = Verified::new(tessera_store::Backed::local(
            BlobDir::open_durable(dir.join("blobs")).unwrap(),
        ));
        let core = FarmCore::new(FarmConfig {
            scheduler: scheduler::Config {
                lease_ms: 1000,
                max_attempts: 3,
                first_epoch: 1 << 32,
                retry_backoff_ms: 0,
                straggler_percent: 0,
            },
            cache_affinity: true,
            pipelining: false,
            heartbeat_ms: 250,
            lease_ms: 1000,
            store_urls: false,
        });
        let addr = "127.0.0.1:7700".parse().unwrap();
        let ticket = |role| Ticket {
            role,
            addr,
            also: Vec::new(),
            fingerprint: "ab".repeat(32),
            secret: Ticket::new_secret(),
        };
        let tickets = crate::data_dir::Tickets {
            worker: ticket(Role::Worker),
            client: ticket(Role::Client),
            viewer: ticket(Role::Viewer),
        };
        let (shared, commits, stitches) = Shared::new(
            core,
            db,
            store,
            Config::new(dir.clone(), addr),
            Identities::new(&tickets),
            addr,
            "ab".repeat(32),
        );
        Farm {
            shared: Arc::new(shared),
            secret: tickets.client.secret.clone(),
            dir,
            _inboxes: (commits, stitches),
        }
    }

    /// A one-frame builtin job whose scene file is `scene` (stored or not).
    fn spec(name: &str, scene: &[u8]) -> JobSpec {
        JobSpec {
            manifest: vec![ManifestEntry {
                path: "scene.json".into(),
                digest: Digest::of(scene),
                size: scene.len() as u64,
                origin: None,
                frame: None,
            }],
            samples: 4,
            resolution: (64, 16),
            ..JobSpec::new(name, Engine::Builtin, "scene.json")
        }
    }

    /// Stores `bytes` as an uploaded blob.
    fn upload(shared: &Shared, bytes: &[u8]) -> Digest {
        let digest = Digest::of(bytes);
        shared.store.put(&digest, bytes).unwrap();
        digest
    }

    /// The kind of a refusal (a value where a refusal was expected fails).
    fn kind<T: std::fmt::Debug>(answer: Answer<T>) -> ErrorKind {
        answer.expect_err("a refusal").kind
    }

    #[tokio::test]
    async fn a_window_of_jobs_is_the_newest_first_with_the_count_of_all_that_match() {
        let f = farm("window");
        let s = &f.shared;
        upload(s, b"scene");
        let mut ids = Vec::new();
        // More than one database batch of jobs.
        for i in 0..(PAGE_ITEMS as u64 + 30) {
            let name = if i % 2 == 0 {
                format!("even_{i}")
            } else {
                format!("odd_{i}")
            };
            ids.push(submit(s, spec(&name, b"scene"), 0).await.unwrap().id);
        }
        cancel(s, ids[3]).unwrap();
        let window = |filter: JobFilter, offset, limit| {
            let (page, total) = jobs_window(s, &filter, offset, limit).unwrap();
            (page.iter().map(|j| j.id).collect::<Vec<_>>(), total)
        };
        let newest: Vec<u64> = ids.iter().rev().copied().collect();
        let n = ids.len() as u64;
        assert_eq!(
            window(JobFilter::default(), 0, 3),
            (newest[..3].to_vec(), n)
        );
        assert_eq!(
            window(JobFilter::default(), 2, 3),
            (newest[2..5].to_vec(), n)
        );
        assert_eq!(window(JobFilter::default(), n as usize, 3), (vec![], n));
        // A name glob, and states the database alone cannot tell apart,
        // are matched and counted job by job.
        let odd = JobFilter {
            name: Some("odd_*".into()),
            ..JobFilter::default()
        };
        let odd_ids: Vec<u64> = newest
            .iter()
            .copied()
            .filter(|i| (i - ids[0]) % 2 == 1)
            .collect();
        assert_eq!(
            window(odd, 1, 2),
            (odd_ids[1..3].to_vec(), odd_ids.len() as u64)
        );
        let canceled = JobFilter {
            states: vec![JobState::Canceled],
            ..JobFilter::default()
        };
        assert_eq!(window(canceled, 0, 10), (vec![ids[3]], 1));
        let active = JobFilter {
            states: vec![JobState::Queued, JobState::Running],
            ..JobFilter::default()
        };
        assert_eq!(window(active, 0, 1), (vec![newest[0]], n - 1));
    }

    #[tokio::test]
    async fn new_frames_are_read_after_a_cursor_in_the_order_stitched() {
        let f = farm("new-frames");
        let s = &f.shared;
        upload(s, b"scene");
        let mut three = spec("three", b"scene");
        three.frames = vec![1, 2, 3];
        three.output_name = Some("shot_####.png".into());
        let id = submit(s, three, 0).await.unwrap().id;
        let stitch = |frame: u32| {
            let stored = StoredFrame {
                frame,
                digest: Digest::of(&frame.to_le_bytes()),
                size: 4,
            };
            s.db().insert_frame(id, &stored).unwrap();
        };
        let nothing = |after| {
            let (frames, next, more) = new_frames(s, id, after).unwrap();
            frames.is_empty() && next == after && !more
        };
        assert!(nothing(0));
        stitch(3);
        stitch(1);
        let (first, cursor, more) = new_frames(s, id, 0).unwrap();
        let names: Vec<_> = first.iter().map(|f| f.name.clone().unwrap()).collect();
        assert_eq!(names, ["shot_0003.png", "shot_0001.png"]);
        assert!(!more && cursor > 0);
        assert!(nothing(cursor));
        stitch(2);
        let (second, next, _) = new_frames(s, id, cursor).unwrap();
        assert_eq!(second.iter().map(|f| f.frame).collect::<Vec<_>>(), [2]);
        assert!(next > cursor);
        // The whole list, by frame, is what it always was.
        let all: Vec<u32> = frames(s, id).unwrap().iter().map(|f| f.frame).collect();
        assert_eq!(all, [1, 2, 3]);
    }

    #[tokio::test]
    async fn every_error_kind_is_answered_by_the_service() {
        use ErrorKind::*;
        let f = farm("kinds");
        let s = &f.shared;
        let mut seen = BTreeSet::new();
        let mut check = |got: ErrorKind, want: ErrorKind, what: &str| {
            assert_eq!(got, want, "{what}");
            seen.insert(format!("{want:?}"));
        };

        // NotFound: no such job, frame or worker, whatever is asked of it.
        check(kind(job(s, 9)), NotFound, "status");
        check(kind(detail(s, 9)), NotFound, "detail");
        check(kind(cancel(s, 9)), NotFound, "cancel");
        check(kind(pause(s, 9, true)), NotFound, "pause");
        check(kind(pause(s, 9, false)), NotFound, "resume");
        check(kind(retry(s, 9).await), NotFound, "retry");
        check(kind(frames(s, 9)), NotFound, "frames");
        check(kind(frames_page(s, 9, None)), NotFound, "frames page");
        check(kind(new_frames(s, 9, 0)), NotFound, "new frames");
        check(kind(frame(s, 9, 1)), NotFound, "frame");
        check(kind(tiles(s, 9, 1)), NotFound, "tiles");
        check(kind(logs(s, 9, None)), NotFound, "logs");
        check(kind(logs_page(s, 9, None, 0)), NotFound, "logs page");
        check(kind(drain(s, 9)), NotFound, "drain");

        // Invalid: a file that was not uploaded, a spec out of bounds, a
        // filter too large. Nothing is recorded.
        check(
            kind(submit(s, spec("missing", b"never uploaded"), 0).await),
            Invalid,
            "a file not uploaded",
        );
        upload(s, b"scene");
        let mut zero = spec("zero", b"scene");
        zero.samples = 0;
        check(kind(submit(s, zero, 0).await), Invalid, "0 samples");
        let big = JobFilter {
            ids: vec![1; MAX_FILTER_IDS + 1],
            ..Default::default()
        };
        check(kind(jobs_page(s, &big, 0)), Invalid, "filter");
        assert!(status(s).unwrap().0.is_empty(), "nothing was recorded");

        // Conflict: a finished job is not canceled, paused, resumed or
        // retried, and stays as it was; a request id names one submit.
        let id = submit(s, spec("ok", b"scene"), 0).await.unwrap().id;
        assert_eq!(job(s, id).unwrap().state, JobState::Queued);
        assert_eq!(frame(s, id, 1).unwrap_err().kind, NotFound, "not stitched");
        check(kind(tiles(s, id, 7)), NotFound, "a frame the job lacks");
        assert_eq!(cancel(s, id).unwrap().state, JobState::Canceled);
        check(kind(cancel(s, id)), Conflict, "cancel of a canceled job");
        check(
            kind(pause(s, id, true)),
            Conflict,
            "pause of a canceled job",
        );
        check(kind(pause(s, id, false)), Conflict, "resume of one");
        check(kind(retry(s, id).await), Conflict, "retry of one");
        assert_eq!(job(s, id).unwrap().state, JobState::Canceled, "as it was");
        let mut first = spec("rid", b"scene");
        first.request_id = Some("r-1".into());
        let rid = submit(s, first.clone(), 0).await.unwrap().id;
        assert_eq!(submit(s, first.clone(), 0).await.unwrap().id, rid);
        first.name = "another".into();
        check(
            kind(submit(s, first, 0).await),
            Conflict,
            "a reused request id",
        );
        let mut after = spec("after", b"scene");
        after.after = vec![id];
        check(
            kind(submit(s, after, 0).await),
            Conflict,
            "after a canceled job",
        );

        // Unauthorized: a missing or wrong secret.
        check(kind(authorize(s, None)), Unauthorized, "no secret");
        check(kind(authorize(s, Some("wrong"))), Unauthorized, "wrong");
        assert_eq!(authorize(s, Some(&f.secret)), Ok(Access::Act));

        // Unavailable: no worker can scan an uploaded .blend now.
        let blend = upload(s, b"BLENDER-v402");
        let version = BlenderVersion::new(4, 2, 0);
        check(
            kind(scan(s, blend, "shot.blend".into(), version).await),
            Unavailable,
            "no worker to scan with",
        );
        // … while a blob that was never uploaded is the client's doing.
        let absent = Digest::of(b"absent");
        check(
            kind(scan(s, absent, "shot.blend".into(), version).await),
            Invalid,
            "scan of a blob not uploaded",
        );

        // Internal: the database fails under the service.
        (s.db().sql())
            .batch("DROP TABLE frames; DROP TABLE task_logs")
            .unwrap();
        check(kind(frames(s, id)), Internal, "frames");
        check(kind(logs(s, id, None)), Internal, "logs");
        (s.db().sql()).batch("DROP TABLE jobs").unwrap();
        check(kind(job(s, id)), Internal, "status");
        check(
            kind(submit(s, spec("late", b"scene"), 0).await),
            Internal,
            "submit",
        );

        let all: BTreeSet<String> = ErrorKind::ALL.iter().map(|k| format!("{k:?}")).collect();
        assert_eq!(seen, all, "every kind was answered");
    }

    /// A running job can be canceled once; paused and resumed while it is
    /// active; drained workers must be connected.
    #[tokio::test]
    async fn an_active_job_is_paused_resumed_and_canceled_once() {
        let f = farm("active");
        let s = &f.shared;
        upload(s, b"scene");
        let id = submit(s, spec("active", b"scene"), 0).await.unwrap().id;
        pause(s, id, true).unwrap();
        assert!(job(s, id).unwrap().paused);
        pause(s, id, false).unwrap();
        assert!(!job(s, id).unwrap().paused);
        assert_eq!(detail(s, id).unwrap().status.id, id);
        assert!(frames(s, id).unwrap().is_empty());
        assert!(logs(s, id, None).unwrap().is_empty());
        assert_eq!(tiles(s, id, 1).unwrap().len(), 1);
        let canceled = cancel(s, id).unwrap();
        assert_eq!(canceled.state, JobState::Canceled);
        assert_eq!(cancel(s, id).unwrap_err().kind, ErrorKind::Conflict);
        // Finished, it is answered from the database.
        assert_eq!(job(s, id).unwrap().state, JobState::Canceled);
        assert_eq!(tiles(s, id, 1).unwrap().len(), 1);
    }
}
