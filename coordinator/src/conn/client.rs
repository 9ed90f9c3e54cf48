//! A client's session: one response per request (blob queries, submit,
//! status, cancel, frames, tiles, pause, drain, garbage collection), or the
//! monitor's feed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tessera_protocol::messages::{ClientRequest, ClientResponse, FrameOutput};
use tessera_protocol::store::BlobStore;
use tessera_protocol::transport::Channel;

use crate::gc::collect_garbage;
use crate::server::Shared;
use crate::submit::submit;

pub(super) async fn serve(
    shared: Arc<Shared>,
    mut control: Channel,
    uploaded: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    while let Some(request) = control.recv::<ClientRequest>().await? {
        let response = match request {
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
                let _gc = shared.gc.lock().expect("gc lock");
                match submit(&shared, spec, uploaded.swap(0, Ordering::Relaxed)) {
                    Ok(status) => ClientResponse::Submitted(status),
                    Err(e) => ClientResponse::Error(format!("{e:#}")),
                }
            }
            ClientRequest::Status(job) => status(&shared, job),
            ClientRequest::Cancel(id) => cancel(&shared, id),
            ClientRequest::Frames(id) => frames(&shared, id),
            ClientRequest::Tiles { job, frame } => {
                match shared.read(|core, _| core.tiles(job, frame)) {
                    Ok(tiles) => ClientResponse::Tiles(tiles),
                    Err(e) => ClientResponse::Error(e),
                }
            }
            ClientRequest::Pause { job, paused } => {
                if shared.update(|core, _| core.pause(job, paused)) {
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
            ClientRequest::Subscribe => return super::feed::feed(&shared, control).await,
        };
        control.send(&response).await?;
    }
    Ok(())
}

fn status(shared: &Shared, job: Option<u64>) -> ClientResponse {
    shared.read(|core, now| match job {
        Some(id) => match core.job_status(id, now) {
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
    })
}

fn cancel(shared: &Arc<Shared>, id: u64) -> ClientResponse {
    match shared.act(|core, now| core.cancel(id, now)) {
        (None, _) => ClientResponse::Error(format!("no job {id} on this coordinator")),
        (Some(_), Err(e)) => ClientResponse::Error(format!("cannot record the cancel: {e:#}")),
        (Some(status), Ok(())) => ClientResponse::Canceled(status),
    }
}

fn frames(shared: &Shared, id: u64) -> ClientResponse {
    let Some(format) = shared.read(|core, _| core.output_format(id)) else {
        return ClientResponse::Error(format!("no job {id} on this coordinator"));
    };
    let stored = shared.db().frames(id);
    match stored {
        Ok(frames) => ClientResponse::Frames(
            frames
                .into_iter()
                .map(|f| FrameOutput {
                    frame: f.frame,
                    digest: f.digest,
                    size: f.size,
                    format,
                })
                .collect(),
        ),
        Err(e) => ClientResponse::Error(e.to_string()),
    }
}
