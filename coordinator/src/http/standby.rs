//! What a standby coordinator's HTTP port answers until it takes the farm
//! over: `/metrics`, to a client or viewer ticket's bearer, with
//! `tessera_farm_lease_held 0` (a standby is scraped like the active one,
//! and is seen alive); every other request `503` of kind `unavailable`,
//! saying that it stands by (clients find the active coordinator through
//! their ticket's other addresses). Small and bounded: at most
//! [`MAX_CONNECTIONS`] at once (the oldest closed for a newcomer), each
//! given [`HANDSHAKE_TIMEOUT`] for its TLS handshake and headers and closed
//! after one answer.

use std::convert::Infallible;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION, RETRY_AFTER, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tessera_protocol::messages::ErrorKind;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::{bearer, full, metrics, Body, HANDSHAKE_TIMEOUT};

/// Most connections a standby serves at once; past it a new one is closed.
const MAX_CONNECTIONS: usize = 64;

/// The tickets' secrets a bearer may show (client, viewer).
pub(crate) struct Bearers {
    pub client: String,
    pub viewer: String,
}

/// Answers on `listener` until its task is aborted (which ends every
/// connection it started); the listener is then the active server's.
pub(crate) async fn answer(
    listener: Arc<TcpListener>,
    tls: Arc<rustls::ServerConfig>,
    bearers: Arc<Bearers>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut connections = JoinSet::new();
    // Oldest first: at the limit, the oldest still open is closed to make
    // room (an answer takes one request: the oldest are the idle ones), so
    // idle sockets never keep a scrape out.
    let mut opened = std::collections::VecDeque::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                opened.retain(|c: &tokio::task::AbortHandle| !c.is_finished());
                if opened.len() >= MAX_CONNECTIONS {
                    if let Some(oldest) = opened.pop_front() {
                        oldest.abort();
                    }
                }
                let (acceptor, bearers) = (acceptor.clone(), bearers.clone());
                let handle = connections.spawn(async move {
                    let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        let bearers = bearers.clone();
                        async move { Ok::<_, Infallible>(respond(&bearers, &req)) }
                    });
                    let served = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HANDSHAKE_TIMEOUT)
                        .keep_alive(false)
                        .serve_connection(TokioIo::new(tls), service);
                    let _ = tokio::time::timeout(2 * HANDSHAKE_TIMEOUT, served).await;
                });
                opened.push_back(handle);
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

fn respond(bearers: &Bearers, req: &Request<Incoming>) -> Response<Body> {
    let mut r = if req.method() == Method::GET && req.uri().path() == "/metrics" {
        let allowed = bearer(req).is_some_and(|secret| {
            tessera_transport::constant_time_eq(secret, &bearers.client)
                || tessera_transport::constant_time_eq(secret, &bearers.viewer)
        });
        if allowed {
            full(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                metrics::render_standby(),
            )
        } else {
            let mut r = error(
                StatusCode::UNAUTHORIZED,
                ErrorKind::Unauthorized,
                "missing or wrong bearer secret: send `Authorization: Bearer SECRET`, SECRET being the client (or viewer) ticket's secret= part",
            );
            r.headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            r
        }
    } else {
        let mut r = error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Unavailable,
            "this coordinator is standing by: another one serves the farm (the ticket names it); this one takes over when it stops",
        );
        r.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("5"));
        r
    };
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    r
}

fn error(status: StatusCode, kind: ErrorKind, message: &str) -> Response<Body> {
    let body = serde_json::json!({ "error": message, "kind": kind.name() });
    full(status, "application/json", body.to_string())
}
