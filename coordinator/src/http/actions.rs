//! The routes that do more than call one service operation: one job's or
//! every event, a job's new priority (its body checked), and revoking a
//! connected worker.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::ACCEPT;
use hyper::{Request, Response, StatusCode};
use serde_json::json;
use tessera_protocol::messages::{ClientError, FarmEvent};

use super::{body_json_within, events as stream, one_number, refused, reply, still_allowed, Body};
use crate::server::Shared;
use crate::service::{self, off_runtime as off};

/// `GET /v1/events`: the farm's events, or one job's. Subscribed before
/// the job is read, so that no event falls between the two; an unknown job
/// is 404, a finished one's stream ends at once.
pub(super) async fn events(
    shared: &Arc<Shared>,
    req: &Request<Incoming>,
) -> Result<Response<Body>, Response<Body>> {
    let sse = (req.headers().get_all(ACCEPT).iter())
        .any(|v| v.to_str().is_ok_and(|v| v.contains("text/event-stream")));
    let rx = service::events(shared);
    let allowed = still_allowed(shared, req);
    Ok(match one_number(req, "job")? {
        None => stream::events(rx, None, None, sse, allowed),
        Some(job) => match off(shared, move |s| service::job(s, job)).await {
            Ok(status) => {
                let ended = status.state.is_final().then(|| {
                    let at = (status.finished_unix_ms).unwrap_or(status.submitted_unix_ms);
                    let state = status.state;
                    (at, FarmEvent::JobChanged { job, state })
                });
                stream::events(rx, Some(job), ended, sse, allowed)
            }
            Err(e) => refused(&e),
        },
    })
}

/// `POST /v1/jobs/{job}/priority` with `{"priority": N}` and nothing else.
pub(super) async fn set_priority(
    shared: &Arc<Shared>,
    job: u64,
    req: Request<Incoming>,
) -> Response<Body> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Asked {
        priority: i32,
    }
    // A small body, and an object (serde would take `[7]` for one).
    let priority = match body_json_within::<serde_json::Value>(req, 4 << 10).await {
        Ok(v @ serde_json::Value::Object(_)) => match serde_json::from_value::<Asked>(v) {
            Ok(asked) => asked.priority,
            Err(e) => return refused(&ClientError::invalid(format!("the body: {e}"))),
        },
        Ok(_) => {
            return refused(&ClientError::invalid(
                "the body must be an object: {\"priority\": N}",
            ))
        }
        Err(r) => return r,
    };
    let answer = off(shared, move |s| service::set_priority(s, job, priority)).await;
    reply(StatusCode::OK, answer)
}

/// `POST /v1/workers/{worker}/revoke`: what was revoked.
pub(super) async fn revoke(shared: &Arc<Shared>, worker: u64) -> Response<Body> {
    let answer = (service::revoke_connected(shared, worker).await).map(
        |(name, identities, disconnected)| {
            json!({"worker": worker, "name": name, "identities": identities,
                   "disconnected": disconnected})
        },
    );
    reply(StatusCode::OK, answer)
}
