//! The HTTP/JSON API, served beside QUIC on TCP with the coordinator's own
//! certificate (TLS 1.3; a client pins it by the client ticket's `fp`, the
//! blake3 of its DER). Every request but `/v1/openapi.json` carries the
//! client ticket's secret as `Authorization: Bearer SECRET`, compared in
//! constant time; a wrong or missing one is answered 401.
//!
//! The handlers are a thin translation: a route and its JSON become a
//! [`ClientRequest`], answered by the same [`handle`] a QUIC client session
//! uses, and its [`ClientResponse`] becomes JSON (an `Error` becomes
//! 400, 404 or 409 with `{"error": …}`). Bodies are the protocol's own
//! serde shapes (a job spec, a job status), so a field added to the
//! protocol flows through. Blob uploads stay on QUIC (`tessera submit
//! --upload-only` uploads and prints the spec to post); stitched frames
//! can be downloaded here. `api/openapi.json` describes every route; a test
//! checks it against this file's [`ROUTES`].

// A refused request's early answer is a `Response` in an `Err`, made once
// per request: its size does not matter.
#![allow(clippy::result_large_err)]

pub mod metrics;

use std::convert::Infallible;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use serde_json::json;
use tessera_protocol::events::{event_job, event_json};
use tessera_protocol::job::JobSpec;
use tessera_protocol::messages::{ClientRequest, ClientResponse, JobFilter, JobState, JobStatus};
use tessera_protocol::store::BlobStore;
use tessera_protocol::Digest;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, Semaphore};
use tokio::task::JoinSet;

use crate::conn::client::handle;
use crate::server::Shared;

/// The OpenAPI 3 document of this API, served at `/v1/openapi.json`.
pub const OPENAPI: &str = include_str!("../../../api/openapi.json");

/// Every route: method and path template, as the OpenAPI document names
/// them (a test compares the two).
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/v1/openapi.json"),
    ("GET", "/v1/status"),
    ("GET", "/v1/jobs"),
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs/{job}"),
    ("POST", "/v1/jobs/{job}/cancel"),
    ("POST", "/v1/jobs/{job}/pause"),
    ("POST", "/v1/jobs/{job}/resume"),
    ("POST", "/v1/jobs/{job}/retry"),
    ("GET", "/v1/jobs/{job}/detail"),
    ("GET", "/v1/jobs/{job}/frames"),
    ("GET", "/v1/jobs/{job}/frames/{frame}"),
    ("GET", "/v1/jobs/{job}/frames/{frame}/tiles"),
    ("GET", "/v1/jobs/{job}/logs"),
    ("GET", "/v1/workers"),
    ("POST", "/v1/workers/{worker}/drain"),
    ("POST", "/v1/blobs/missing"),
    ("GET", "/v1/events"),
    ("GET", "/metrics"),
];

/// The most bytes a request body may take (a job spec with a large manifest).
const MAX_BODY: usize = 64 << 20;
/// Connections served at once; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 256;
/// How long a connection may take to finish its TLS handshake, and to send
/// a request's headers.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// An event stream with nothing to say sends an empty line this often, so
/// a client that went away is noticed.
const KEEPALIVE: Duration = Duration::from_secs(10);

type Body = BoxBody<Bytes, Infallible>;

/// Serves the API on `listener` until its task is aborted (which aborts
/// every connection it started).
pub(crate) async fn serve(
    shared: Arc<Shared>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _peer)) = accepted else { continue };
                let (shared, acceptor) = (shared.clone(), acceptor.clone());
                connections.spawn(async move {
                    let _permit = permit;
                    let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(respond(&shared, req).await) }
                    });
                    let served = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HANDSHAKE_TIMEOUT)
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                    if let Err(e) = served {
                        tracing::debug!("http connection ended: {e}");
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// The TLS configuration: the QUIC endpoint's certificate, HTTP/1.1.
pub(crate) fn tls(
    identity: &tessera_protocol::transport::Identity,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let mut tls = tessera_protocol::transport::server_tls(identity)?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(tls))
}

fn full(status: StatusCode, content_type: &str, bytes: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(bytes.into()).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_str(content_type).expect("ascii"),
    );
    r
}

fn ok_json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(bytes) => full(status, "application/json", bytes),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e}")),
    }
}

fn error(status: StatusCode, message: &str) -> Response<Body> {
    ok_json(status, &json!({ "error": message }))
}

/// The status an `Error` reply maps to: a missing job, worker or frame is
/// 404, a job in the wrong state 409, anything else (a refused submit) 400.
fn error_status(message: &str) -> StatusCode {
    if message.starts_with("no job ")
        || message.starts_with("no worker ")
        || message.contains("does not render frame")
    {
        StatusCode::NOT_FOUND
    } else if message.contains("is not queued or running") {
        StatusCode::CONFLICT
    } else {
        StatusCode::BAD_REQUEST
    }
}

/// Whether the request carries the client ticket's secret.
fn authorized(shared: &Shared, req: &Request<Incoming>) -> bool {
    let Some(value) = req.headers().get(AUTHORIZATION) else {
        return false;
    };
    let Some(secret) = value.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")) else {
        return false;
    };
    shared.identities.client_secret_is(secret.trim())
}

async fn respond(shared: &Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    if req.method() == Method::GET && path == "/v1/openapi.json" {
        return full(StatusCode::OK, "application/json", OPENAPI);
    }
    if !authorized(shared, &req) {
        let mut r = error(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer secret: send `Authorization: Bearer SECRET`, SECRET being the client ticket's secret= part",
        );
        r.headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return r;
    }
    match route(shared, req).await {
        Ok(r) => r,
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e:#}")),
    }
}

/// The query's `key=value` pairs, percent-decoded.
fn query(req: &Request<Incoming>) -> Vec<(String, String)> {
    let q = req.uri().query().unwrap_or("");
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn body_json<T: serde::de::DeserializeOwned>(
    req: Request<Incoming>,
) -> Result<T, Response<Body>> {
    let body = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                &format!("cannot read the body: {e}"),
            )
        })?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            &format!("the body is not valid: {e}"),
        )
    })
}

/// Carries out one request the QUIC way.
async fn ask(shared: &Arc<Shared>, request: ClientRequest) -> anyhow::Result<ClientResponse> {
    // HTTP uploads nothing: a job's uploaded bytes are counted on the QUIC
    // connection that uploaded them.
    handle(shared, request, &AtomicU64::new(0)).await
}

fn parse_id<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, Response<Body>> {
    s.parse()
        .map_err(|_| error(StatusCode::NOT_FOUND, &format!("`{s}` is not a {what} id")))
}

/// The jobs `GET /v1/status` and `GET /v1/jobs` list: the protocol's
/// [`JobFilter`], applied by the same query `tessera status` asks.
fn filter(pairs: &[(String, String)]) -> Result<JobFilter, Response<Body>> {
    let mut f = JobFilter::default();
    let bad = |k: &str, v: &str, want: &str| {
        error(
            StatusCode::BAD_REQUEST,
            &format!("`{k}={v}`: expected {want}"),
        )
    };
    for (k, v) in pairs {
        match k.as_str() {
            "state" => {
                for s in v.split(',').filter(|s| !s.is_empty()) {
                    let state = [
                        JobState::Queued,
                        JobState::Running,
                        JobState::Done,
                        JobState::Failed,
                        JobState::Canceled,
                    ]
                    .into_iter()
                    .find(|st| st.name() == s)
                    .ok_or_else(|| bad(k, v, "queued, running, done, failed or canceled"))?;
                    f.states.push(state);
                }
            }
            "name" => f.name = Some(v.clone()),
            "since" => {
                f.since_unix_ms = Some(v.parse().map_err(|_| bad(k, v, "unix milliseconds"))?)
            }
            "ids" => {
                for id in v.split(',').filter(|s| !s.is_empty()) {
                    f.ids
                        .push(id.parse().map_err(|_| bad(k, v, "job ids: 1,2,3"))?);
                }
            }
            _ => return Err(bad(k, v, "one of state, name, since, ids")),
        }
    }
    Ok(f)
}

/// A reply as JSON: `Error` mapped to its status, anything else by `f`.
fn reply(
    response: ClientResponse,
    f: impl FnOnce(ClientResponse) -> Option<Response<Body>>,
) -> Response<Body> {
    match response {
        ClientResponse::Error(e) => error(error_status(&e), &e),
        other => f(other).unwrap_or_else(|| {
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the coordinator gave an unexpected reply",
            )
        }),
    }
}

async fn job_status(shared: &Arc<Shared>, job: u64) -> anyhow::Result<Response<Body>> {
    Ok(reply(
        ask(shared, ClientRequest::Status(Some(job))).await?,
        |r| match r {
            ClientResponse::Status { jobs, .. } => jobs.first().map(|j| ok_json(StatusCode::OK, j)),
            _ => None,
        },
    ))
}

async fn route(shared: &Arc<Shared>, req: Request<Incoming>) -> anyhow::Result<Response<Body>> {
    let path = req.uri().path().to_string();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let method = req.method().clone();
    macro_rules! id {
        ($s:expr, $what:expr) => {
            match parse_id($s, $what) {
                Ok(id) => id,
                Err(r) => return Ok(r),
            }
        };
    }
    Ok(match (&method, segments.as_slice()) {
        (&Method::GET, ["metrics"]) => {
            let text = metrics::render(shared)?;
            full(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                text,
            )
        }
        (&Method::GET, ["v1", "status"]) | (&Method::GET, ["v1", "jobs"]) => {
            let f = match filter(&query(&req)) {
                Ok(f) => f,
                Err(r) => return Ok(r),
            };
            let jobs_only = segments[1] == "jobs";
            let mut jobs: Vec<JobStatus> = Vec::new();
            let mut after = 0;
            loop {
                let filter = f.clone();
                match ask(shared, ClientRequest::JobsPage { filter, after }).await? {
                    ClientResponse::JobsPage { jobs: page, next } => {
                        jobs.extend(page);
                        match next {
                            Some(n) => after = n,
                            None => break,
                        }
                    }
                    other => return Ok(reply(other, |_| None)),
                }
            }
            if jobs_only {
                ok_json(StatusCode::OK, &jobs)
            } else {
                let workers = shared.read(|core, now| core.worker_statuses(now));
                ok_json(StatusCode::OK, &json!({"jobs": jobs, "workers": workers}))
            }
        }
        (&Method::POST, ["v1", "jobs"]) => {
            let spec: JobSpec = match body_json(req).await {
                Ok(s) => s,
                Err(r) => return Ok(r),
            };
            reply(
                ask(shared, ClientRequest::Submit(spec)).await?,
                |r| match r {
                    ClientResponse::Submitted(status) => {
                        Some(ok_json(StatusCode::CREATED, &status))
                    }
                    _ => None,
                },
            )
        }
        (&Method::GET, ["v1", "jobs", job]) => job_status(shared, id!(job, "job")).await?,
        (&Method::POST, ["v1", "jobs", job, "cancel"]) => {
            let job = id!(job, "job");
            reply(
                ask(shared, ClientRequest::Cancel(job)).await?,
                |r| match r {
                    ClientResponse::Canceled(status) => Some(ok_json(StatusCode::OK, &status)),
                    _ => None,
                },
            )
        }
        (&Method::POST, ["v1", "jobs", job, "retry"]) => {
            let job = id!(job, "job");
            reply(ask(shared, ClientRequest::Retry(job)).await?, |r| match r {
                ClientResponse::Retried(status) => Some(ok_json(StatusCode::OK, &status)),
                _ => None,
            })
        }
        (&Method::GET, ["v1", "jobs", job, "detail"]) => {
            let job = id!(job, "job");
            reply(
                ask(shared, ClientRequest::JobDetail(job)).await?,
                |r| match r {
                    ClientResponse::JobDetail(detail) => Some(ok_json(StatusCode::OK, &detail)),
                    _ => None,
                },
            )
        }
        (&Method::POST, ["v1", "jobs", job, action @ ("pause" | "resume")]) => {
            let job = id!(job, "job");
            let paused = *action == "pause";
            match ask(shared, ClientRequest::Pause { job, paused }).await? {
                ClientResponse::Done => job_status(shared, job).await?,
                other => reply(other, |_| None),
            }
        }
        (&Method::GET, ["v1", "jobs", job, "frames"]) => {
            let job = id!(job, "job");
            reply(
                ask(shared, ClientRequest::Frames(job)).await?,
                |r| match r {
                    ClientResponse::Frames(frames) => Some(ok_json(StatusCode::OK, &frames)),
                    _ => None,
                },
            )
        }
        (&Method::GET, ["v1", "jobs", job, "frames", frame]) => {
            let (job, frame): (u64, u32) = (id!(job, "job"), id!(frame, "frame"));
            let found = match ask(shared, ClientRequest::Frames(job)).await? {
                ClientResponse::Frames(frames) => frames.into_iter().find(|f| f.frame == frame),
                other => return Ok(reply(other, |_| None)),
            };
            let Some(found) = found else {
                return Ok(error(
                    StatusCode::NOT_FOUND,
                    &format!("frame {frame} of job {job} is not stitched (yet)"),
                ));
            };
            let shared2 = shared.clone();
            let bytes = tokio::task::spawn_blocking(move || shared2.store.get(&found.digest))
                .await?
                .with_context(|| format!("reading frame {frame} of job {job}"))?;
            shared.http_bytes_out(bytes.len() as u64);
            let mut r = full(StatusCode::OK, "application/octet-stream", bytes);
            let h = r.headers_mut();
            h.insert(
                "x-tessera-digest",
                HeaderValue::from_str(&found.digest.to_hex()).expect("hex"),
            );
            if let Some(name) = found
                .name
                .as_deref()
                .filter(|n| n.bytes().all(|b| b.is_ascii_graphic() && b != b'"'))
            {
                if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
                    h.insert("content-disposition", v);
                }
            }
            r
        }
        (&Method::GET, ["v1", "jobs", job, "frames", frame, "tiles"]) => {
            let (job, frame) = (id!(job, "job"), id!(frame, "frame"));
            reply(
                ask(shared, ClientRequest::Tiles { job, frame }).await?,
                |r| match r {
                    ClientResponse::Tiles(tiles) => Some(ok_json(StatusCode::OK, &tiles)),
                    _ => None,
                },
            )
        }
        (&Method::GET, ["v1", "jobs", job, "logs"]) => {
            let job = id!(job, "job");
            let mut task = None;
            for (k, v) in query(&req) {
                match k.as_str() {
                    "task" => task = Some(id!(&v, "task")),
                    _ => {
                        return Ok(error(
                            StatusCode::BAD_REQUEST,
                            &format!("unknown query `{k}`: expected task"),
                        ))
                    }
                }
            }
            reply(
                ask(shared, ClientRequest::Logs { job, task }).await?,
                |r| match r {
                    ClientResponse::Logs(logs) => Some(ok_json(StatusCode::OK, &logs)),
                    _ => None,
                },
            )
        }
        (&Method::GET, ["v1", "workers"]) => {
            let workers = shared.read(|core, now| core.worker_statuses(now));
            ok_json(StatusCode::OK, &workers)
        }
        (&Method::POST, ["v1", "workers", worker, "drain"]) => {
            let worker = id!(worker, "worker");
            reply(
                ask(shared, ClientRequest::Drain { worker }).await?,
                |r| match r {
                    ClientResponse::Done => Some(ok_json(
                        StatusCode::OK,
                        &json!({"worker": worker, "draining": true}),
                    )),
                    _ => None,
                },
            )
        }
        (&Method::POST, ["v1", "blobs", "missing"]) => {
            #[derive(serde::Deserialize)]
            struct Asked {
                digests: Vec<Digest>,
            }
            let asked: Asked = match body_json(req).await {
                Ok(a) => a,
                Err(r) => return Ok(r),
            };
            reply(
                ask(shared, ClientRequest::MissingBlobs(asked.digests)).await?,
                |r| match r {
                    ClientResponse::Missing(missing) => {
                        Some(ok_json(StatusCode::OK, &json!({ "missing": missing })))
                    }
                    _ => None,
                },
            )
        }
        (&Method::GET, ["v1", "events"]) => {
            let mut job = None;
            for (k, v) in query(&req) {
                match k.as_str() {
                    "job" => job = Some(id!(&v, "job")),
                    _ => {
                        return Ok(error(
                            StatusCode::BAD_REQUEST,
                            &format!("unknown query `{k}`: expected job"),
                        ))
                    }
                }
            }
            events(shared, job)
        }
        _ => {
            let known = ROUTES.iter().any(|(_, template)| {
                let t: Vec<&str> = template.trim_matches('/').split('/').collect();
                t.len() == segments.len()
                    && t.iter()
                        .zip(&segments)
                        .all(|(t, s)| t.starts_with('{') || t == s)
            });
            if known {
                error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    &format!("{method} is not served at {path}"),
                )
            } else {
                error(StatusCode::NOT_FOUND, &format!("no route {path}"))
            }
        }
    })
}

/// A body fed by a channel: the event stream.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

/// Every farm event from now on (of one job, when `job` is given), one JSON
/// object a line, after an empty line. A reader that falls behind gets
/// `{"type":"lagged","missed":N}` in place of the events it missed.
fn events(shared: &Arc<Shared>, job: Option<u64>) -> Response<Body> {
    let mut rx = shared.events();
    let (tx, body) = mpsc::channel::<Bytes>(64);
    // An empty line at once: the headers go out with it, so a client knows
    // it is subscribed before it submits anything.
    let _ = tx.try_send(Bytes::from_static(b"\n"));
    tokio::spawn(async move {
        loop {
            let line = tokio::select! {
                event = rx.recv() => match event {
                    Ok((unix_ms, event)) => {
                        if job.is_some() && event_job(&event) != job {
                            continue;
                        }
                        event_json(unix_ms, &event).to_string()
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        json!({"type": "lagged", "missed": n}).to_string()
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tokio::time::sleep(KEEPALIVE) => String::new(),
            };
            if tx.send(Bytes::from(line + "\n")).await.is_err() {
                return;
            }
        }
    });
    let mut r = Response::new(ChannelBody(body).boxed());
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_percent_decoded() {
        assert_eq!(percent_decode("sh%2A+a"), "sh* a");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
