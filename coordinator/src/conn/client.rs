//! A client's session: one response per request (blob queries, submit,
//! status, cancel, frames, tiles, pause, drain, garbage collection), or the
//! monitor's feed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::collections::HashSet;

use tessera_protocol::messages::{
    take_page, ClientRequest, ClientResponse, FrameOutput, JobState, JobStatus, TileState,
    TileStatus, PAGE_ITEMS,
};
use tessera_protocol::store::BlobStore;
use tessera_protocol::transport::Channel;

use crate::builds::{add_build, list_builds};
use crate::gc::collect_garbage;
use crate::server::{unix_ms, Shared};
use crate::submit::submit;
use crate::{data_dir, identity};

pub(super) async fn serve(
    shared: Arc<Shared>,
    mut control: Channel,
    uploaded: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    while let Some(request) = control.recv::<ClientRequest>().await? {
        if let ClientRequest::Subscribe = request {
            return super::feed::feed(&shared, control).await;
        }
        let response = handle(&shared, request, &uploaded).await?;
        control.send(&fits(response)).await?;
    }
    Ok(())
}

/// One request's answer: the one place a client request is carried out,
/// for a QUIC client session and for the HTTP API ([`crate::http`]) alike.
/// `uploaded`: bytes this client uploaded since its last submit (counted as
/// the next job's). A `Subscribe` is answered by the caller (a feed).
pub(crate) async fn handle(
    shared: &Arc<Shared>,
    request: ClientRequest,
    uploaded: &AtomicU64,
) -> anyhow::Result<ClientResponse> {
    Ok(match request {
        ClientRequest::MissingBlobs(digests) => ClientResponse::Missing(
            digests
                .into_iter()
                .filter(|d| !shared.store.touch(d))
                .collect(),
        ),
        ClientRequest::KnownLists(lists) => {
            let store = shared.store.clone();
            ClientResponse::Known(
                tokio::task::spawn_blocking(move || {
                    lists.iter().map(|l| store.file_of_list(l)).collect()
                })
                .await?,
            )
        }
        ClientRequest::Assemble(list) => {
            let store = shared.store.clone();
            match tokio::task::spawn_blocking(move || store.assemble_list(&list)).await? {
                Ok(file) => ClientResponse::Assembled(file),
                Err(e) => ClientResponse::Error(e.to_string()),
            }
        }
        ClientRequest::CollectGarbage => {
            let shared = shared.clone();
            match tokio::task::spawn_blocking(move || collect_garbage(&shared)).await? {
                Ok(c) => ClientResponse::Collected(c),
                Err(e) => ClientResponse::Error(format!("garbage collection failed: {e:#}")),
            }
        }
        ClientRequest::Submit(spec) => {
            let _gc = crate::server::relock(&shared.gc);
            match submit(shared, spec, uploaded.swap(0, Ordering::Relaxed)) {
                Ok(status) => ClientResponse::Submitted(status),
                Err(e) => ClientResponse::Error(format!("{e:#}")),
            }
        }
        ClientRequest::AddBuild(digest) => {
            let shared = shared.clone();
            let unix_ms = shared.now().unix_ms;
            match tokio::task::spawn_blocking(move || add_build(&shared, digest, unix_ms)).await? {
                Ok(info) => ClientResponse::BuildAdded(info),
                Err(e) => ClientResponse::Error(format!("{e:#}")),
            }
        }
        ClientRequest::Builds => {
            let shared = shared.clone();
            match tokio::task::spawn_blocking(move || list_builds(&shared)).await? {
                Ok(builds) => ClientResponse::Builds(builds),
                Err(e) => ClientResponse::Error(format!("{e:#}")),
            }
        }
        ClientRequest::Status(job) => status(shared, job),
        ClientRequest::Cancel(id) => cancel(shared, id),
        ClientRequest::Frames(id) => frames(shared, id),
        ClientRequest::Logs { job, task } => logs(shared, job, task),
        ClientRequest::Tiles { job, frame } => tiles(shared, job, frame),
        ClientRequest::Pause { job, paused } => {
            if shared.update(|core, now| core.pause(job, paused, now)) {
                ClientResponse::Done
            } else {
                ClientResponse::Error(format!("job {job} is not queued or running"))
            }
        }
        ClientRequest::Drain { worker } => {
            if shared.update(|core, _| core.drain(worker)) {
                ClientResponse::Done
            } else {
                ClientResponse::Error(format!("no worker {worker} is connected"))
            }
        }
        ClientRequest::RevokeWorker { name } => revoke(shared, &name).await,
        ClientRequest::RotateTickets => rotate_tickets(shared),
        ClientRequest::Scan {
            blend,
            path,
            version,
        } => super::scan::scan(shared, blend, path, version).await,
        ClientRequest::Subscribe => {
            ClientResponse::Error("a feed is asked for on a session of its own".into())
        }
        ClientRequest::StatusPage {
            after_job,
            after_worker,
        } => status_page(shared, after_job, after_worker),
        ClientRequest::LogsPage { job, task, after } => logs_page(shared, job, task, after),
        ClientRequest::FramesPage { job, after } => frames_page(shared, job, after),
        ClientRequest::Retry(id) => match crate::retry::retry(shared, id) {
            Ok(status) => ClientResponse::Retried(status),
            Err(e) => ClientResponse::Error(format!("{e:#}")),
        },
        ClientRequest::JobDetail(id) => {
            panic_if_asked(shared, id);
            match crate::query::job_detail(shared, id) {
                Ok(Some(detail)) => ClientResponse::JobDetail(Box::new(detail)),
                Ok(None) => ClientResponse::Error(format!("no job {id} on this coordinator")),
                Err(e) => ClientResponse::Error(format!("{e:#}")),
            }
        }
        ClientRequest::JobsPage { filter, after } => {
            match crate::query::jobs_page(shared, &filter, after) {
                Ok((jobs, next)) => ClientResponse::JobsPage { jobs, next },
                Err(e) => ClientResponse::Error(format!("{e:#}")),
            }
        }
    })
}

/// Failpoint (see `commit::FAILPOINT`): a request for the status of job
/// `u64::MAX` panics this connection's handler while it holds the core's
/// lock, for the test that shows one handler's panic stops nothing else.
pub const FAILPOINT_PANIC_IN_HANDLER: &str = "panic-in-handler";
/// Revokes the identities enrolled as `name` and closes their connections,
/// answering once their sessions have ended (their leases are back in the
/// queue) or a heartbeat has passed.
async fn revoke(shared: &Shared, name: &str) -> ClientResponse {
    let revoked = {
        let db = shared.db();
        identity::revoke(db.conn(), name, unix_ms())
    };
    match revoked {
        Ok(ids) if ids.is_empty() => {
            ClientResponse::Error(format!("no worker was ever enrolled as `{name}`"))
        }
        Ok(ids) => {
            let within = Duration::from_millis(shared.config.heartbeat_ms);
            let disconnected = shared.identities.disconnect(&ids, within).await;
            tracing::warn!(%name, identities = ids.len(), disconnected, "worker revoked");
            ClientResponse::Revoked {
                identities: ids.len() as u32,
                disconnected,
            }
        }
        Err(e) => ClientResponse::Error(format!("cannot revoke `{name}`: {e}")),
    }
}

/// New secrets for both tickets, written to the data dir first, then used.
fn rotate_tickets(shared: &Shared) -> ClientResponse {
    match data_dir::rotate_tickets(
        &shared.config.data_dir,
        shared.advertised,
        &shared.fingerprint,
    ) {
        Ok((worker, client)) => {
            shared.identities.rotate(&worker, &client);
            tracing::warn!("tickets rotated: the old ones are refused from now on");
            ClientResponse::Tickets {
                worker: worker.to_string(),
                client: client.to_string(),
            }
        }
        Err(e) => ClientResponse::Error(format!("cannot rotate the tickets: {e:#}")),
    }
}

/// A reply that would not fit its frame becomes an error saying to ask page
/// by page, instead of ending the connection.
fn fits(response: ClientResponse) -> ClientResponse {
    let too_long = tessera_protocol::codec::encode(&response).is_err();
    if too_long {
        ClientResponse::Error(
            "the answer is too long for one reply: ask page by page (a newer tessera does)".into(),
        )
    } else {
        response
    }
}

/// One page of every job (active ones from the core, the rest from the
/// database) and of the connected workers.
fn status_page(shared: &Shared, after_job: u64, after_worker: u64) -> ClientResponse {
    let answer = || -> anyhow::Result<ClientResponse> {
        let stored = shared.db().jobs_page(after_job, PAGE_ITEMS as u32 + 1)?;
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
        Ok(ClientResponse::StatusPage {
            jobs,
            workers,
            more: more_jobs || more_stored || more_workers,
        })
    };
    answer().unwrap_or_else(|e| ClientResponse::Error(format!("{e:#}")))
}

fn logs_page(shared: &Shared, job: u64, task: Option<u32>, after: u64) -> ClientResponse {
    let answer = || -> anyhow::Result<ClientResponse> {
        if shared.db().job(job)?.is_none() {
            return Ok(ClientResponse::Error(format!(
                "no job {job} on this coordinator"
            )));
        }
        let rows = (shared.db()).task_logs_page(job, task, after, PAGE_ITEMS as u32 + 1)?;
        let (page, cut) = take_page(rows);
        let next = (cut || page.len() > PAGE_ITEMS)
            .then(|| page.last().map(|(cursor, _)| *cursor))
            .flatten();
        Ok(ClientResponse::LogsPage {
            logs: page.into_iter().map(|(_, l)| l).collect(),
            next,
        })
    };
    answer().unwrap_or_else(|e| ClientResponse::Error(format!("{e:#}")))
}

fn frames_page(shared: &Shared, id: u64, after: Option<u32>) -> ClientResponse {
    match frames(shared, id) {
        ClientResponse::Frames(all) => {
            let rest = all
                .into_iter()
                .filter(|f| after.is_none_or(|a| f.frame > a));
            let (frames, more) = take_page(rest);
            let next = more.then(|| frames.last().map(|f| f.frame)).flatten();
            ClientResponse::FramesPage { frames, next }
        }
        other => other,
    }
}

/// The failpoint [`FAILPOINT_PANIC_IN_HANDLER`]: asked about job
/// `u64::MAX`, the handler panics while it holds the farm core's lock.
fn panic_if_asked(shared: &Shared, job: u64) {
    if job == u64::MAX
        && std::env::var(crate::commit::FAILPOINT).as_deref() == Ok(FAILPOINT_PANIC_IN_HANDLER)
    {
        shared
            .read(|_, _| panic!("failpoint: a panic in a connection handler, under the core lock"));
    }
}

fn status(shared: &Shared, job: Option<u64>) -> ClientResponse {
    if let Some(job) = job {
        panic_if_asked(shared, job);
    }
    let answer = || -> anyhow::Result<ClientResponse> {
        Ok(match job {
            Some(id) => match shared.job_status(id)? {
                // The first page of workers (`StatusPage` has them all).
                Some(status) => ClientResponse::Status {
                    jobs: vec![status],
                    workers: take_page(shared.read(|core, now| core.worker_statuses(now))).0,
                },
                None => ClientResponse::Error(format!("no job {id} on this coordinator")),
            },
            None => {
                let snapshot = shared.snapshot(u32::MAX)?;
                ClientResponse::Status {
                    jobs: snapshot.jobs,
                    workers: snapshot.workers,
                }
            }
        })
    };
    answer().unwrap_or_else(|e| ClientResponse::Error(format!("{e:#}")))
}

fn cancel(shared: &Arc<Shared>, id: u64) -> ClientResponse {
    match shared.act(|core, now| core.cancel(id, now)) {
        (Some(_), Err(e)) => ClientResponse::Error(format!("cannot record the cancel: {e:#}")),
        (Some(status), Ok(())) => ClientResponse::Canceled(status),
        // Not active: finished already (it stays as it was), or unknown.
        (None, _) => match shared.job_status(id) {
            Ok(Some(status)) => ClientResponse::Canceled(status),
            Ok(None) => ClientResponse::Error(format!("no job {id} on this coordinator")),
            Err(e) => ClientResponse::Error(format!("{e:#}")),
        },
    }
}

/// The logs of a job's failed attempts (of one task, or all).
fn logs(shared: &Shared, job: u64, task: Option<u32>) -> ClientResponse {
    let answer = || -> anyhow::Result<ClientResponse> {
        if shared.db().job(job)?.is_none() {
            return Ok(ClientResponse::Error(format!(
                "no job {job} on this coordinator"
            )));
        }
        Ok(ClientResponse::Logs(shared.db().task_logs(job, task)?))
    };
    answer().unwrap_or_else(|e| ClientResponse::Error(format!("{e:#}")))
}

fn frames(shared: &Shared, id: u64) -> ClientResponse {
    let answer = || -> anyhow::Result<ClientResponse> {
        // The database holds every job's spec, running or finished.
        let spec = shared.db().job(id)?.map(|j| j.spec);
        let Some(spec) = spec else {
            return Ok(ClientResponse::Error(format!(
                "no job {id} on this coordinator"
            )));
        };
        let (format, template) = (spec.output, spec.output_name.as_deref());
        // Unreal frames are named as Movie Render Queue names them.
        let name = |frame: u32| match &spec.unreal {
            Some(u) => Some(u.frame_file_name(&spec.frames, frame, format)),
            None => template.and_then(|t| tessera_protocol::job::frame_file_name(t, frame)),
        };
        let frames = shared.db().frames(id)?;
        Ok(ClientResponse::Frames(
            frames
                .into_iter()
                .map(|f| FrameOutput {
                    frame: f.frame,
                    digest: f.digest,
                    size: f.size,
                    format,
                    name: name(f.frame),
                })
                .collect(),
        ))
    };
    answer().unwrap_or_else(|e| ClientResponse::Error(format!("{e:#}")))
}

/// Every tile of one frame, for the mosaic: from the core while the job is
/// active, from the database once it is finished.
fn tiles(shared: &Shared, job: u64, frame: u32) -> ClientResponse {
    if let Ok(tiles) = shared.read(|core, _| core.tiles(job, frame)) {
        return ClientResponse::Tiles(tiles);
    }
    let answer = || -> anyhow::Result<ClientResponse> {
        let Some(stored) = shared.db().job(job)? else {
            return Ok(ClientResponse::Error(format!(
                "no job {job} on this coordinator"
            )));
        };
        let spec = &stored.spec;
        let Some(pos) = spec.frames.iter().position(|&f| f == frame) else {
            return Ok(ClientResponse::Error(format!(
                "job {job} does not render frame {frame}"
            )));
        };
        let first_of = |pos: u32| pos * spec.tasks_per_frame();
        let per_frame = spec.tiles.count() * spec.sample_ranges;
        let first = first_of(pos as u32);
        let done: HashSet<u32> = (shared.db().results(job)?.into_iter())
            .map(|r| r.index)
            .filter(|i| (first..first + per_frame).contains(i))
            .collect();
        let (w, h) = spec.resolution;
        let tiles = (0..spec.tiles.count())
            .map(|tile| {
                let tasks =
                    first + tile * spec.sample_ranges..first + (tile + 1) * spec.sample_ranges;
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
            .collect();
        Ok(ClientResponse::Tiles(tiles))
    };
    answer().unwrap_or_else(|e| ClientResponse::Error(format!("{e:#}")))
}
