//! The HTTP/JSON API, served beside QUIC on TCP with the coordinator's own
//! certificate (TLS 1.3; a client pins it by the client ticket's `fp`, the
//! blake3 of its DER). Every request but `/v1/openapi.json` carries the
//! client ticket's secret as `Authorization: Bearer SECRET`, compared in
//! constant time; a wrong or missing one is answered 401.
//!
//! The handlers are a thin translation: a route and its JSON become a call
//! of [`crate::service`], the same operations a QUIC client session asks
//! for, and the answer becomes JSON; a refusal becomes its
//! [`ErrorKind`]'s status (404, 409, 400, 401, 503, 500) with `{"error":
//! …, "kind": …}`, never a status picked by the message's words (the
//! HTTP layer's own 400, 401 and 404 carry their kind too; 405 and 413
//! have none). Bodies are the protocol's own
//! serde shapes (a job spec, a job status), so a field added to the
//! protocol flows through. Blob uploads stay on QUIC (`tessera submit
//! --upload-only` uploads and prints the spec to post); stitched frames
//! can be downloaded here. `api/openapi.json` describes every route; a test
//! checks it against this file's [`ROUTES`], the one list the router is
//! built from (matchit's path tree).

// A refused request's early answer is a `Response` in an `Err`, made once
// per request: its size does not matter.
#![allow(clippy::result_large_err)]

mod actions;
pub mod dashboard;
mod events;
mod frames;
mod list;
pub mod metrics;
pub mod places;
pub mod preview;
pub mod session;
pub(crate) mod standby;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{
    HeaderValue, ALLOW, AUTHORIZATION, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE,
    WWW_AUTHENTICATE,
};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use serde_json::json;
use tessera_protocol::job::JobSpec;
use tessera_protocol::messages::{ClientError, ErrorKind, JobFilter, JobState};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::identity::Access;
use crate::server::Shared;
use crate::service::{self, off_runtime as off, Answer};
use places::{Place, Places};

/// The OpenAPI 3 document of this API, served at `/v1/openapi.json`.
pub const OPENAPI: &str = include_str!("../../../api/openapi.json");

/// What a route does: one arm of [`route`] each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handler {
    OpenApi,
    Status,
    Jobs,
    Submit,
    Job,
    Cancel,
    Pause,
    Resume,
    Retry,
    Detail,
    Frames,
    Frame,
    Tiles,
    Preview,
    TilePreview,
    Zip,
    Priority,
    Logs,
    Workers,
    Worker,
    Fleet,
    Drain,
    Revoke,
    BlobsMissing,
    Events,
    Metrics,
}

/// One route: its method, its path template as the OpenAPI document names
/// it (matchit's syntax is the same, `{job}`), and what it does.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    handler: Handler,
}

const fn at(method: &'static str, path: &'static str, handler: Handler) -> Route {
    Route {
        method,
        path,
        handler,
    }
}

/// Every route. The router is built from this list and answers nothing
/// else; a test compares it with the OpenAPI document.
pub const ROUTES: &[Route] = &[
    at("GET", "/v1/openapi.json", Handler::OpenApi),
    at("GET", "/v1/status", Handler::Status),
    at("GET", "/v1/jobs", Handler::Jobs),
    at("POST", "/v1/jobs", Handler::Submit),
    at("GET", "/v1/jobs/{job}", Handler::Job),
    at("POST", "/v1/jobs/{job}/cancel", Handler::Cancel),
    at("POST", "/v1/jobs/{job}/pause", Handler::Pause),
    at("POST", "/v1/jobs/{job}/resume", Handler::Resume),
    at("POST", "/v1/jobs/{job}/retry", Handler::Retry),
    at("POST", "/v1/jobs/{job}/priority", Handler::Priority),
    at("GET", "/v1/jobs/{job}/detail", Handler::Detail),
    at("GET", "/v1/jobs/{job}/frames", Handler::Frames),
    at("GET", "/v1/jobs/{job}/frames.zip", Handler::Zip),
    at("GET", "/v1/jobs/{job}/frames/{frame}", Handler::Frame),
    at("GET", "/v1/jobs/{job}/frames/{frame}/tiles", Handler::Tiles),
    at(
        "GET",
        "/v1/jobs/{job}/frames/{frame}/preview",
        Handler::Preview,
    ),
    at(
        "GET",
        "/v1/jobs/{job}/frames/{frame}/tiles/{tile}/preview",
        Handler::TilePreview,
    ),
    at("GET", "/v1/jobs/{job}/logs", Handler::Logs),
    at("GET", "/v1/workers", Handler::Workers),
    at("GET", "/v1/workers/{worker}", Handler::Worker),
    at("GET", "/v1/fleet", Handler::Fleet),
    at("POST", "/v1/workers/{worker}/drain", Handler::Drain),
    at("POST", "/v1/workers/{worker}/revoke", Handler::Revoke),
    at("POST", "/v1/blobs/missing", Handler::BlobsMissing),
    at("GET", "/v1/events", Handler::Events),
    at("GET", "/metrics", Handler::Metrics),
];

/// The path tree of [`ROUTES`]: each template to the routes (one a method)
/// served there.
fn router() -> &'static matchit::Router<Vec<Route>> {
    static ROUTER: std::sync::LazyLock<matchit::Router<Vec<Route>>> =
        std::sync::LazyLock::new(|| {
            let mut by_path: Vec<(&str, Vec<Route>)> = Vec::new();
            for r in ROUTES {
                match by_path.iter_mut().find(|(p, _)| *p == r.path) {
                    Some((_, routes)) => routes.push(*r),
                    None => by_path.push((r.path, vec![*r])),
                }
            }
            let mut router = matchit::Router::new();
            for (path, routes) in by_path {
                router
                    .insert(path, routes)
                    .expect("ROUTES are distinct templates");
            }
            router
        });
    &ROUTER
}

/// A request's path matched against [`ROUTES`]: the route and its
/// parameters, or the answer when none is served (404 for a path no
/// template matches, 405 for one served under other methods). Slashes at
/// either end are ignored, as they always were.
fn find(method: &Method, path: &str) -> Result<(Handler, Params), Response<Body>> {
    let normalized = format!("/{}", path.trim_matches('/'));
    let Ok(found) = router().at(&normalized) else {
        return Err(error(StatusCode::NOT_FOUND, &format!("no route {path}")));
    };
    let Some(route) = found.value.iter().find(|r| r.method == method.as_str()) else {
        let mut r = error(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("{method} is not served at {path}"),
        );
        // The methods that are (RFC 9110: a 405 names them).
        let allowed: Vec<&str> = found.value.iter().map(|r| r.method).collect();
        let allowed = HeaderValue::from_str(&allowed.join(", ")).expect("method names");
        r.headers_mut().insert(ALLOW, allowed);
        return Err(r);
    };
    let params = Params {
        job: found.params.get("job").map(str::to_string),
        frame: found.params.get("frame").map(str::to_string),
        worker: found.params.get("worker").map(str::to_string),
        tile: found.params.get("tile").map(str::to_string),
    };
    Ok((route.handler, params))
}

/// A route's path parameters, as the request spelled them.
#[derive(Debug, Default)]
struct Params {
    job: Option<String>,
    frame: Option<String>,
    worker: Option<String>,
    tile: Option<String>,
}

/// The most bytes a request body may take (a job spec with a large manifest).
const MAX_BODY: usize = 64 << 20;
/// How long a request body may take to arrive, once its headers have.
const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a connection may take to finish its TLS handshake, and to send
/// a request's headers; also how long a kept-alive connection may sit idle
/// between requests.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

type Body = BoxBody<Bytes, Infallible>;

/// Serves the API on `listener` until its task is aborted (which aborts
/// every connection it started). Every connection is accepted at once and
/// takes a place (see [`places`]): idle sockets never keep a newcomer out.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let places = Places::new(places::LIMITS);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, peer)) = accepted else { continue };
                let place = Arc::new(places.admit(peer.ip()));
                let (shared, acceptor) = (shared.clone(), acceptor.clone());
                connections.spawn(async move {
                    let serve = async {
                        let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await else {
                            return;
                        };
                        place.handshaken();
                        let service = {
                            let place = place.clone();
                            hyper::service::service_fn(move |req| {
                                let (shared, place) = (shared.clone(), place.clone());
                                async move { Ok::<_, Infallible>(respond(&shared, &place, req).await) }
                            })
                        };
                        let served = hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(HANDSHAKE_TIMEOUT)
                            .serve_connection(TokioIo::new(tls), service)
                            .await;
                        if let Err(e) = served {
                            tracing::debug!("http connection ended: {e}");
                        }
                    };
                    tokio::select! {
                        () = serve => {}
                        () = place.evicted() => {
                            tracing::debug!(%peer, "http connection closed to make room: it had made no authenticated request");
                        }
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {
                // What the ended connection used is trimmed in a while.
                (shared.metrics.connections_closed).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

/// The TLS configuration: the QUIC endpoint's certificate, HTTP/1.1.
pub(crate) fn tls(
    identity: &tessera_transport::Identity,
    cert: Option<&crate::config::HttpCert>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let mut tls = match cert {
        None => tessera_transport::server_tls(identity)?,
        Some(c) => {
            // An operator's files, still bounded: a chain and a key are a
            // few kilobytes, /dev/zero is not.
            let read = |p: &std::path::Path| -> anyhow::Result<Vec<u8>> {
                use std::io::Read;
                const MAX_PEM: u64 = 1 << 20;
                let mut bytes = Vec::new();
                (std::fs::File::open(p).and_then(|f| f.take(MAX_PEM + 1).read_to_end(&mut bytes)))
                    .with_context(|| format!("cannot read {}", p.display()))?;
                anyhow::ensure!(
                    bytes.len() as u64 <= MAX_PEM,
                    "{} is over {} KiB: not a certificate chain or key",
                    p.display(),
                    MAX_PEM >> 10
                );
                Ok(bytes)
            };
            tessera_transport::server_tls_pem(&read(&c.chain)?, &read(&c.key)?).with_context(
                || {
                    format!(
                        "--http-cert {} --http-key {}",
                        c.chain.display(),
                        c.key.display()
                    )
                },
            )?
        }
    };
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

/// An error answer: `{"error": message, "kind": …}`, the kind being the
/// [`ErrorKind`] whose status this is (none for 405 and 413, which are the
/// HTTP layer's own).
fn error(status: StatusCode, message: &str) -> Response<Body> {
    let kind = (ErrorKind::ALL.into_iter()).find(|k| k.http_status() == status.as_u16());
    match kind {
        Some(kind) => ok_json(status, &json!({ "error": message, "kind": kind.name() })),
        None => ok_json(status, &json!({ "error": message })),
    }
}

/// The bearer secret the request carries, if any (the scheme's name in
/// any case, RFC 9110 §11.1).
fn bearer(req: &Request<Incoming>) -> Option<&str> {
    bearer_of(req.headers().get(AUTHORIZATION)?.to_str().ok()?)
}

fn bearer_of(value: &str) -> Option<&str> {
    let (scheme, secret) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(secret.trim())
}

async fn respond(shared: &Arc<Shared>, place: &Place, req: Request<Incoming>) -> Response<Body> {
    if dashboard::serves(req.uri().path()) {
        return dashboard::respond(shared, place, req).await;
    }
    let mut r = answer(shared, place, req).await;
    // Farm data is neither cached nor sniffed as another type.
    let h = r.headers_mut();
    h.entry(CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

async fn answer(shared: &Arc<Shared>, place: &Place, req: Request<Incoming>) -> Response<Body> {
    let found = find(req.method(), req.uri().path());
    if let Ok((Handler::OpenApi, _)) = found {
        return full(StatusCode::OK, "application/json", OPENAPI);
    }
    let access = match authenticate(shared, &req) {
        Ok(access) => access,
        Err(r) => return r,
    };
    place.authenticated();
    let (handler, params) = match found {
        Ok(found) => found,
        Err(r) => return r,
    };
    if access == Access::Look && req.method() != Method::GET {
        return error(
            StatusCode::FORBIDDEN,
            "refused: the viewer ticket can only look; acting needs the client ticket",
        );
    }
    match route(shared, handler, params, place.addr(), req).await {
        Ok(r) => r,
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e:#}")),
    }
}

/// What the request may do: its bearer's (client or viewer ticket), or,
/// without one, its dashboard session's, whose requests that change
/// something must also carry the session's CSRF token. 401 (or 403 for a
/// missing CSRF token) otherwise.
fn authenticate(shared: &Shared, req: &Request<Incoming>) -> Result<Access, Response<Body>> {
    let unauthorized = |e: &ClientError| {
        let mut r = refused(e);
        r.headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        r
    };
    let signed_in = (req.headers().get(AUTHORIZATION).is_none())
        .then(|| session::token(req.headers()))
        .flatten();
    let Some(token) = signed_in else {
        return service::authorize(shared, bearer(req)).map_err(|e| unauthorized(&e));
    };
    let Some(s) = shared.sessions.find(token) else {
        return Err(unauthorized(&ClientError::new(
            ErrorKind::Unauthorized,
            "the dashboard session ended (signed out, expired, the coordinator restarted or the tickets were rotated): sign in again",
        )));
    };
    if req.method() != Method::GET && !session::csrf_ok(req.headers(), &s) {
        return Err(dashboard::csrf_refused());
    }
    Ok(s.access)
}

/// Whether the credential `req` was let in by still lets it in: its
/// bearer is still a ticket's, its session still live. What a long
/// answer (an event stream) asks as it goes.
fn still_allowed(shared: &Arc<Shared>, req: &Request<Incoming>) -> impl Fn() -> bool + Send {
    let shared = shared.clone();
    let bearer = bearer(req).map(str::to_string);
    let token = session::token(req.headers()).map(str::to_string);
    move || match (&bearer, &token) {
        (Some(secret), _) => shared.identities.http_access(secret).is_some(),
        (None, Some(token)) => shared.sessions.find(token).is_some(),
        (None, None) => false,
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
    body_json_within(req, MAX_BODY).await
}

/// The request's body as JSON, refused past `limit` bytes.
async fn body_json_within<T: serde::de::DeserializeOwned>(
    req: Request<Incoming>,
    limit: usize,
) -> Result<T, Response<Body>> {
    // A declared size over the bound is refused before any of the body is
    // read; a body that grows past it while read, likewise.
    let declared = (req.headers().get(CONTENT_LENGTH))
        .map(|v| v.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()));
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &match limit >> 20 {
                0 => format!("the body is over the {} KiB limit", limit >> 10),
                mib => format!("the body is over the {mib} MiB limit"),
            },
        )
    };
    match declared {
        Some(None) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "Content-Length is not a number",
            ))
        }
        Some(Some(n)) if n > limit as u64 => return Err(too_large()),
        _ => {}
    }
    // A body that trickles in holds its connection no longer than this.
    let read = tokio::time::timeout(BODY_TIMEOUT, Limited::new(req.into_body(), limit).collect());
    let body = match read.await {
        Err(_) => {
            return Err(error(
                StatusCode::REQUEST_TIMEOUT,
                &format!(
                    "the body did not arrive within {} s",
                    BODY_TIMEOUT.as_secs()
                ),
            ))
        }
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
        Ok(Err(e)) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                &format!("cannot read the body: {e}"),
            ))
        }
    };
    serde_json::from_slice(&body).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            &format!("the body is not valid: {e}"),
        )
    })
}

fn parse_id<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, Response<Body>> {
    s.parse().map_err(|_| {
        // Named back as given, but never more than a line of it.
        let shown: String = s.chars().take(40).collect();
        let cut = if shown.len() < s.len() { "…" } else { "" };
        error(
            StatusCode::NOT_FOUND,
            &format!("`{shown}{cut}` is not a {what} id"),
        )
    })
}

/// A query parameter that should be a number: 400 (a path's id that is
/// not one names nothing: 404).
fn not_a_number(key: &str, value: &str) -> Response<Body> {
    error(
        StatusCode::BAD_REQUEST,
        &format!("`{key}={value}`: expected a number"),
    )
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
                    let states = JobState::named(s).ok_or_else(|| {
                        bad(
                            k,
                            v,
                            "queued, running, done, failed, canceled, active or finished",
                        )
                    })?;
                    f.states.extend(states);
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
            // `GET /v1/jobs`'s page: read by `list`.
            "limit" | "offset" => {}
            _ => return Err(bad(k, v, "one of state, name, since, ids, limit, offset")),
        }
    }
    Ok(f)
}

/// A service answer as a response: the value as JSON with `status`, or
/// the error as its kind's status.
fn reply<T: Serialize>(status: StatusCode, answer: Answer<T>) -> Response<Body> {
    match answer {
        Ok(value) => ok_json(status, &value),
        Err(e) => refused(&e),
    }
}

/// A refusal: the status code of its kind, `{"error": …, "kind": …}`.
fn refused(e: &ClientError) -> Response<Body> {
    let status = StatusCode::from_u16(e.kind.http_status()).expect("a valid status code");
    error(status, &e.message)
}

/// A route's id parameter, or the 404 its absence or its spelling earns.
fn param<T: std::str::FromStr>(value: &Option<String>, what: &str) -> Result<T, Response<Body>> {
    parse_id(value.as_deref().unwrap_or(""), what)
}

async fn route(
    shared: &Arc<Shared>,
    handler: Handler,
    params: Params,
    peer: std::net::IpAddr,
    req: Request<Incoming>,
) -> anyhow::Result<Response<Body>> {
    macro_rules! id {
        ($p:ident, $what:expr) => {
            match param(&params.$p, $what) {
                Ok(id) => id,
                Err(r) => return Ok(r),
            }
        };
    }
    let ok = StatusCode::OK;
    Ok(match handler {
        Handler::OpenApi => full(ok, "application/json", OPENAPI),
        Handler::Metrics => {
            let text = {
                let shared = shared.clone();
                tokio::task::spawn_blocking(move || metrics::render(&shared)).await??
            };
            full(ok, "text/plain; version=0.0.4; charset=utf-8", text)
        }
        Handler::Status | Handler::Jobs => list::list(shared, &req, handler == Handler::Jobs).await,
        Handler::Submit => {
            let spec: JobSpec = match body_json(req).await {
                Ok(s) => s,
                Err(r) => return Ok(r),
            };
            // HTTP uploads nothing: a job's uploaded bytes are counted on
            // the QUIC connection that uploaded them.
            reply(StatusCode::CREATED, service::submit(shared, spec, 0).await)
        }
        Handler::Job => {
            let id = id!(job, "job");
            reply(ok, off(shared, move |s| service::job(s, id)).await)
        }
        Handler::Cancel => {
            let id = id!(job, "job");
            reply(ok, off(shared, move |s| service::cancel(s, id)).await)
        }
        Handler::Retry => reply(ok, service::retry(shared, id!(job, "job")).await),
        Handler::Detail => {
            let id = id!(job, "job");
            reply(ok, off(shared, move |s| service::detail(s, id)).await)
        }
        Handler::Pause | Handler::Resume => {
            let job = id!(job, "job");
            let paused = handler == Handler::Pause;
            reply(
                ok,
                off(shared, move |s| {
                    service::pause(s, job, paused).and_then(|()| service::job(s, job))
                })
                .await,
            )
        }
        Handler::Frames => {
            let id = id!(job, "job");
            reply(ok, off(shared, move |s| service::frames(s, id)).await)
        }
        Handler::Frame => frames::frame(shared, id!(job, "job"), id!(frame, "frame")).await?,
        Handler::Zip => frames::zip(shared, id!(job, "job"), peer).await?,
        Handler::Priority => actions::set_priority(shared, id!(job, "job"), req).await,
        Handler::Tiles => {
            let (job, frame) = (id!(job, "job"), id!(frame, "frame"));
            reply(
                ok,
                off(shared, move |s| service::tiles(s, job, frame)).await,
            )
        }
        Handler::Preview => preview::frame(shared, id!(job, "job"), id!(frame, "frame")).await?,
        Handler::TilePreview => {
            let (job, frame, tile) = (id!(job, "job"), id!(frame, "frame"), id!(tile, "tile"));
            preview::tile(shared, job, frame, tile).await?
        }
        Handler::Logs => {
            let job = id!(job, "job");
            let task = match one_number(&req, "task") {
                Ok(task) => task,
                Err(r) => return Ok(r),
            };
            reply(ok, off(shared, move |s| service::logs(s, job, task)).await)
        }
        Handler::Workers => ok_json(ok, &service::workers(shared)),
        Handler::Worker => {
            let worker = id!(worker, "worker");
            reply(ok, service::worker(shared, worker))
        }
        Handler::Revoke => actions::revoke(shared, id!(worker, "worker")).await,
        Handler::Fleet => reply(
            ok,
            service::fleet(shared)
                .map(|(at, report)| json!({"reported_unix_ms": at, "report": report})),
        ),
        Handler::Drain => {
            let worker = id!(worker, "worker");
            reply(
                ok,
                off(shared, move |s| service::drain(s, worker))
                    .await
                    .map(|()| json!({"worker": worker, "draining": true})),
            )
        }
        Handler::BlobsMissing => frames::blobs_missing(shared, req).await?,
        Handler::Events => match actions::events(shared, &req).await {
            Ok(r) | Err(r) => r,
        },
    })
}

/// The only query parameter a route takes, `key`, a number when given:
/// 400 for anything else.
fn one_number<T: std::str::FromStr>(
    req: &Request<Incoming>,
    key: &str,
) -> Result<Option<T>, Response<Body>> {
    let mut found = None;
    for (k, v) in query(req) {
        if k != key {
            return Err(error(
                StatusCode::BAD_REQUEST,
                &format!("unknown query `{k}`: expected {key}"),
            ));
        }
        found = Some(v.parse().map_err(|_| not_a_number(&k, &v))?);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_read_in_any_case() {
        assert_eq!(bearer_of("Bearer s3cret"), Some("s3cret"));
        assert_eq!(bearer_of("bearer s3cret"), Some("s3cret"));
        assert_eq!(bearer_of("BEARER  s3cret "), Some("s3cret"));
        assert_eq!(bearer_of("Basic czNjcmV0"), None);
        assert_eq!(bearer_of("Bearer"), None);
    }

    #[test]
    fn queries_are_percent_decoded() {
        assert_eq!(percent_decode("sh%2A+a"), "sh* a");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }

    #[test]
    fn the_router_serves_routes_and_tells_404_from_405() {
        let found =
            |m: Method, p: &str| find(&m, p).map(|(h, params)| (h, params.job, params.frame));
        let status = |m: Method, p: &str| find(&m, p).err().map(|r| r.status().as_u16());
        assert_eq!(
            found(Method::GET, "/v1/jobs/7/frames/3/tiles").unwrap(),
            (Handler::Tiles, Some("7".into()), Some("3".into()))
        );
        assert_eq!(found(Method::GET, "/v1/jobs/").unwrap().0, Handler::Jobs);
        assert_eq!(
            found(Method::GET, "/v1/jobs/7/frames.zip").unwrap(),
            (Handler::Zip, Some("7".into()), None)
        );
        assert_eq!(
            found(Method::GET, "/v1/jobs/7/frames/3").unwrap(),
            (Handler::Frame, Some("7".into()), Some("3".into()))
        );
        let (handler, params) = find(&Method::GET, "/v1/jobs/7/frames/3/tiles/5/preview").unwrap();
        assert_eq!(
            (handler, params.tile.as_deref()),
            (Handler::TilePreview, Some("5"))
        );
        assert_eq!(found(Method::POST, "/v1/jobs").unwrap().0, Handler::Submit);
        assert_eq!(
            found(Method::POST, "/v1/jobs/1/resume").unwrap().0,
            Handler::Resume
        );
        assert_eq!(status(Method::DELETE, "/v1/jobs/1"), Some(405));
        let allow = |m: Method, p: &str| find(&m, p).err().unwrap().headers()[ALLOW].clone();
        assert_eq!(allow(Method::DELETE, "/v1/jobs"), "GET, POST");
        assert_eq!(allow(Method::TRACE, "/v1/jobs/1/cancel"), "POST");
        assert_eq!(status(Method::POST, "/metrics"), Some(405));
        assert_eq!(status(Method::GET, "/v1/nothing"), Some(404));
        assert_eq!(status(Method::GET, "/v1/jobs/1/cancel/more"), Some(404));
        assert_eq!(status(Method::GET, "/"), Some(404));
    }
}
