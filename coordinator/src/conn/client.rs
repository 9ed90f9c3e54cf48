//! A client's session: one response per request (blob queries, submit,
//! status, cancel, frames, tiles, pause, drain, garbage collection), or the
//! monitor's feed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tessera_protocol::messages::{take_page, ClientError, ClientRequest, ClientResponse};
use tessera_store::BlobStore;
use tessera_transport::Channel;

use crate::builds::{add_build, list_builds};
use crate::data_dir;
use crate::gc::collect_garbage;
use crate::server::Shared;
use crate::service::{self, internal, off_runtime as off, Answer};

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
        control.send(&fits(response, control.codec())).await?;
    }
    Ok(())
}

/// One request's answer: the translation of a QUIC client's request onto
/// [`crate::service`] (which the HTTP API calls too), and the requests
/// only the CLI makes (uploads' chunk lists, builds, scans, revocation,
/// tickets, garbage collection). `uploaded`: bytes this client uploaded
/// since its last submit (counted as the next job's). A `Subscribe` is
/// answered by the caller (a feed).
///
/// Long because: one arm per request kind, each a line or a call; the
/// dispatch reads best whole.
pub(crate) async fn handle(
    shared: &Arc<Shared>,
    request: ClientRequest,
    uploaded: &AtomicU64,
) -> anyhow::Result<ClientResponse> {
    Ok(match request {
        // Touching each stored file is disk work: off the runtime.
        ClientRequest::MissingBlobs(digests) => ClientResponse::Missing(
            shared
                .blocking(move |s| {
                    let stored = s.store.inner().touch_many(&digests);
                    (digests.into_iter().zip(stored))
                        .filter_map(|(d, stored)| (!stored).then_some(d))
                        .collect()
                })
                .await?,
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
            // The client named chunks it did not upload, or ones that do
            // not join into a file of the list's size.
            answer(
                (tokio::task::spawn_blocking(move || store.assemble_list(&list)).await?)
                    .map_err(|e| ClientError::invalid(e.to_string())),
                ClientResponse::Assembled,
            )
        }
        ClientRequest::CollectGarbage => {
            let shared = shared.clone();
            answer(
                (tokio::task::spawn_blocking(move || collect_garbage(&shared)).await?)
                    .map_err(|e| internal(e.context("garbage collection failed"))),
                ClientResponse::Collected,
            )
        }
        ClientRequest::Submit(spec) => answer(
            service::submit(shared, spec, uploaded.swap(0, Ordering::Relaxed)).await,
            ClientResponse::Submitted,
        ),
        ClientRequest::AddBuild(digest) => {
            let shared = shared.clone();
            let unix_ms = shared.now().unix_ms;
            // What `add_build` refuses is what the client sent: a manifest
            // that is not one, files not stored.
            answer(
                (tokio::task::spawn_blocking(move || add_build(&shared, digest, unix_ms)).await?)
                    .map_err(|e| ClientError::invalid(format!("{e:#}"))),
                ClientResponse::BuildAdded,
            )
        }
        ClientRequest::Builds => {
            let shared = shared.clone();
            answer(
                (tokio::task::spawn_blocking(move || list_builds(&shared)).await?)
                    .map_err(internal),
                ClientResponse::Builds,
            )
        }
        ClientRequest::Status(Some(id)) => {
            service::panic_if_asked(shared, id);
            // The first page of workers (`StatusPage` has them all).
            answer(off(shared, move |s| service::job(s, id)).await, |status| {
                ClientResponse::Status {
                    jobs: vec![status],
                    workers: take_page(service::workers(shared)).0,
                }
            })
        }
        ClientRequest::Status(None) => answer(
            off(shared, |s| service::status(s)).await,
            |(jobs, workers)| ClientResponse::Status { jobs, workers },
        ),
        ClientRequest::Cancel(id) => answer(
            off(shared, move |s| service::cancel(s, id)).await,
            ClientResponse::Canceled,
        ),
        ClientRequest::Frames(id) => answer(
            off(shared, move |s| service::frames(s, id)).await,
            ClientResponse::Frames,
        ),
        ClientRequest::Logs { job, task } => answer(
            off(shared, move |s| service::logs(s, job, task)).await,
            ClientResponse::Logs,
        ),
        ClientRequest::Tiles { job, frame } => answer(
            off(shared, move |s| service::tiles(s, job, frame)).await,
            ClientResponse::Tiles,
        ),
        ClientRequest::Pause { job, paused } => answer(
            off(shared, move |s| service::pause(s, job, paused)).await,
            |()| ClientResponse::Done,
        ),
        ClientRequest::Drain { worker } => {
            answer(service::drain(shared, worker), |()| ClientResponse::Done)
        }
        ClientRequest::RevokeWorker { name } => answer(
            service::revoke(shared, name).await,
            |(identities, disconnected)| ClientResponse::Revoked {
                identities,
                disconnected,
            },
        ),
        ClientRequest::RotateTickets => {
            // Files and, on a shared state, the database: off the runtime.
            match off(shared, |s| Ok(rotate_tickets(s))).await {
                Ok(response) => response,
                Err(e) => ClientResponse::Error(e),
            }
        }
        ClientRequest::Scan {
            blend,
            path,
            version,
        } => answer(
            service::scan(shared, blend, path, version).await,
            |(worker, json)| ClientResponse::Scanned { worker, json },
        ),
        ClientRequest::Subscribe => ClientResponse::Error(ClientError::invalid(
            "a feed is asked for on a session of its own",
        )),
        ClientRequest::StatusPage {
            after_job,
            after_worker,
        } => answer(
            off(shared, move |s| {
                service::status_page(s, after_job, after_worker)
            })
            .await,
            |(jobs, workers, more)| ClientResponse::StatusPage {
                jobs,
                workers,
                more,
            },
        ),
        ClientRequest::LogsPage { job, task, after } => answer(
            off(shared, move |s| service::logs_page(s, job, task, after)).await,
            |(logs, next)| ClientResponse::LogsPage { logs, next },
        ),
        ClientRequest::FramesPage { job, after } => answer(
            off(shared, move |s| service::frames_page(s, job, after)).await,
            |(frames, next)| ClientResponse::FramesPage { frames, next },
        ),
        ClientRequest::NewFrames { job, after } => answer(
            off(shared, move |s| service::new_frames(s, job, after)).await,
            |(frames, next, more)| ClientResponse::NewFrames { frames, next, more },
        ),
        ClientRequest::Retry(id) => {
            answer(service::retry(shared, id).await, ClientResponse::Retried)
        }
        ClientRequest::JobDetail(id) => {
            answer(off(shared, move |s| service::detail(s, id)).await, |d| {
                ClientResponse::JobDetail(Box::new(d))
            })
        }
        ClientRequest::SetPriority { job, priority } => answer(
            off(shared, move |s| service::set_priority(s, job, priority)).await,
            ClientResponse::Prioritized,
        ),
        ClientRequest::FleetReport(report) => answer(service::fleet_report(shared, report), |()| {
            ClientResponse::Done
        }),
        ClientRequest::JobsPage { filter, after } => answer(
            off(shared, move |s| service::jobs_page(s, &filter, after)).await,
            |(jobs, next)| ClientResponse::JobsPage { jobs, next },
        ),
    })
}

/// A service answer as a reply: its value by `f`, or the error with its
/// kind.
fn answer<T>(answer: Answer<T>, f: impl FnOnce(T) -> ClientResponse) -> ClientResponse {
    match answer {
        Ok(value) => f(value),
        Err(e) => ClientResponse::Error(e),
    }
}

/// New secrets for the three tickets, written to the shared state (where
/// the farm's other coordinators take them from when they take over) and
/// the data dir first, then used; every dashboard session ends (it was
/// signed in with an old one).
fn rotate_tickets(shared: &Shared) -> ClientResponse {
    let fresh = data_dir::ticket_secrets(&shared.config.data_dir, true);
    if shared.db().is_postgres() {
        let named: Vec<(&str, &[u8])> = (data_dir::SECRET_NAMES.iter().copied())
            .zip(fresh.iter().map(String::as_bytes))
            .collect();
        if let Err(e) = shared.db().set_shared_secrets(&named) {
            return ClientResponse::Error(internal(
                anyhow::Error::from(e).context("cannot rotate the tickets"),
            ));
        }
    }
    match data_dir::write_tickets_for(
        &shared.config.data_dir,
        &shared.lease.addrs(),
        &shared.fingerprint,
        fresh,
    ) {
        Ok(tickets) => {
            shared.identities.rotate(&tickets);
            let ended = shared.sessions.end_all();
            tracing::warn!(
                sessions_ended = ended,
                "tickets rotated: the old ones are refused from now on"
            );
            ClientResponse::Tickets {
                worker: tickets.worker.to_string(),
                client: tickets.client.to_string(),
            }
        }
        Err(e) => ClientResponse::Error(internal(e.context("cannot rotate the tickets"))),
    }
}

/// A reply that would not fit its frame becomes an error saying to ask page
/// by page, instead of ending the connection.
fn fits(response: ClientResponse, codec: tessera_protocol::codec::Codec) -> ClientResponse {
    let too_long = tessera_protocol::codec::encode_as(codec, &response).is_err();
    if too_long {
        ClientResponse::Error(ClientError::invalid(
            "the answer is too long for one reply: ask page by page (a newer tessera does)",
        ))
    } else {
        response
    }
}
