//! The web dashboard, served at `/` beside the API on the same TLS
//! listener. Its page, script and style are files embedded in the binary
//! (`ui/`: plain HTML, CSS and a JavaScript module, no build step); they
//! hold no farm data and are served to anyone. Everything the page shows
//! it reads from the API (`/v1/…`) with a session cookie, which signing in
//! with the client or the viewer ticket's secret gives (see
//! [`super::session`]):
//!
//! | route | what |
//! |---|---|
//! | `GET /`, `/ui/app.js`, `/ui/app.css` | the page |
//! | `POST /ui/signin` `{"secret": …}` | a session: the cookie, and `{"role", "csrf"}` |
//! | `GET /ui/session` | the session's `{"role", "csrf"}` (401 without one) |
//! | `POST /ui/signout` | ends the session (with its CSRF token) |

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, CACHE_CONTROL, SET_COOKIE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;
use tessera_protocol::ticket::Ticket;

use super::places::Place;
use super::session::{self, Session};
use super::{body_json_within, error, full, ok_json, Body};
use crate::server::Shared;

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");

/// The most bytes a sign-in's body may take.
const MAX_SIGNIN: usize = 4096;

/// What the page may load and where it may connect: itself alone.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Whether `path` is the dashboard's (not the API's).
pub fn serves(path: &str) -> bool {
    path == "/" || path.starts_with("/ui/")
}

/// Answers a request for one of the dashboard's routes.
pub(crate) async fn respond(
    shared: &Arc<Shared>,
    place: &Place,
    req: Request<Incoming>,
) -> Response<Body> {
    let mut r = route(shared, place, req).await;
    let h = r.headers_mut();
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.entry(CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    r
}

async fn route(shared: &Arc<Shared>, place: &Place, req: Request<Incoming>) -> Response<Body> {
    let ok = StatusCode::OK;
    let asset = |kind: &str, text: &'static str| {
        let mut r = full(ok, kind, text);
        // The files change only with the binary: a reload asks again.
        (r.headers_mut()).insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        r
    };
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/") => asset("text/html; charset=utf-8", INDEX),
        (&Method::GET, "/ui/app.js") => asset("text/javascript; charset=utf-8", SCRIPT),
        (&Method::GET, "/ui/app.css") => asset("text/css; charset=utf-8", STYLE),
        (&Method::GET, "/ui/session") => match current(shared, &req) {
            Some((_, s)) => {
                place.authenticated();
                told(&s)
            }
            None => signed_out(),
        },
        (&Method::POST, "/ui/signin") => sign_in(shared, place, req).await,
        (&Method::POST, "/ui/signout") => match current(shared, &req) {
            Some((token, s)) if session::csrf_ok(req.headers(), &s) => {
                shared.sessions.end(&token);
                let mut r = ok_json(ok, &json!({ "signed_out": true }));
                (r.headers_mut()).insert(SET_COOKIE, session::clear_cookie());
                r
            }
            Some(_) => csrf_refused(),
            None => signed_out(),
        },
        (_, "/" | "/ui/app.js" | "/ui/app.css" | "/ui/session") => {
            error(StatusCode::METHOD_NOT_ALLOWED, "GET only")
        }
        (_, "/ui/signin" | "/ui/signout") => error(StatusCode::METHOD_NOT_ALLOWED, "POST only"),
        (_, path) => error(StatusCode::NOT_FOUND, &format!("no page {path}")),
    }
}

/// The request's live session and its token.
fn current(shared: &Shared, req: &Request<Incoming>) -> Option<(String, Session)> {
    let token = session::token(req.headers())?;
    let s = shared.sessions.find(token)?;
    Some((token.to_string(), s))
}

fn told(s: &Session) -> Response<Body> {
    ok_json(
        StatusCode::OK,
        &json!({ "role": s.access.name(), "csrf": s.csrf }),
    )
}

fn signed_out() -> Response<Body> {
    let mut r = error(
        StatusCode::UNAUTHORIZED,
        "not signed in, or the session ended",
    );
    (r.headers_mut()).insert(SET_COOKIE, session::clear_cookie());
    r
}

/// 403: a signed-in request that would change something without its
/// session's CSRF token (a cross-site form, a forged request).
pub fn csrf_refused() -> Response<Body> {
    error(
        StatusCode::FORBIDDEN,
        &format!(
            "refused: a request that changes something must carry the session's CSRF token in {}",
            session::CSRF_HEADER
        ),
    )
}

/// `POST /ui/signin`: `{"secret": S}`, S the client or viewer ticket's
/// `secret=` part or the whole ticket.
async fn sign_in(shared: &Arc<Shared>, place: &Place, req: Request<Incoming>) -> Response<Body> {
    #[derive(serde::Deserialize)]
    struct SignIn {
        secret: String,
    }
    let given: SignIn = match body_json_within(req, MAX_SIGNIN).await {
        Ok(g) => g,
        Err(r) => return r,
    };
    let secret = match given.secret.trim().parse::<Ticket>() {
        Ok(ticket) => ticket.secret,
        Err(_) => given.secret.trim().to_string(),
    };
    match shared.identities.http_access(&secret) {
        Some(access) => {
            place.authenticated();
            let (token, s) = shared.sessions.begin(access);
            tracing::info!(role = access.name(), "dashboard sign-in");
            let mut r = told(&s);
            (r.headers_mut()).insert(SET_COOKIE, session::set_cookie(&token));
            r
        }
        None => error(
            StatusCode::UNAUTHORIZED,
            "wrong secret: paste the client ticket (to act) or the viewer ticket (to look), or its secret= part",
        ),
    }
}
