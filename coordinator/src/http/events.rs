//! `GET /v1/events`: the farm's events as NDJSON or Server-Sent Events,
//! fed from the coordinator's broadcast channel.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Frame;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::Response;
use serde_json::json;
use tessera_protocol::events::{event_job, event_json};
use tessera_protocol::messages::FarmEvent;
use tokio::sync::{broadcast, mpsc};

use super::Body;

/// An event stream with nothing to say sends an empty line this often, so
/// a client that went away is noticed.
const KEEPALIVE: Duration = Duration::from_secs(10);

/// A body fed by a channel: the event stream.
pub(super) struct ChannelBody(pub(super) mpsc::Receiver<Bytes>);

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

/// Every farm event from `rx` (of one job, when `job` is given), one JSON
/// object a line after an empty line, or as Server-Sent Events (`data:
/// JSON`, comments to keep alive) when `sse`. A reader that falls behind
/// gets `{"type":"lagged","missed":N}` in place of the events it missed.
/// One job's stream ends after the event that finishes it (done, failed,
/// canceled), or, when it had finished when asked for, is that event
/// alone (`ended`, as its status tells it). It ends as soon as `allowed`
/// says its reader's credential no longer is.
pub(super) fn events(
    mut rx: broadcast::Receiver<(u64, FarmEvent)>,
    job: Option<u64>,
    ended: Option<(u64, FarmEvent)>,
    sse: bool,
    allowed: impl Fn() -> bool + Send + 'static,
) -> Response<Body> {
    let (tx, body) = mpsc::channel::<Bytes>(64);
    let frame = move |json: String| -> Bytes {
        match (sse, json.is_empty()) {
            (false, _) => Bytes::from(json + "\n"),
            (true, true) => Bytes::from_static(b":\n\n"),
            (true, false) => Bytes::from(format!("data: {json}\n\n")),
        }
    };
    // Something at once: the headers go out with it, so a client knows it
    // is subscribed before it submits anything.
    let _ = tx.try_send(frame(String::new()));
    if let Some((unix_ms, event)) = ended {
        let _ = tx.try_send(frame(event_json(unix_ms, &event).to_string()));
        drop(tx);
        return stream_response(body, sse);
    }
    tokio::spawn(async move {
        loop {
            let mut last = false;
            let line = tokio::select! {
                event = rx.recv() => match event {
                    Ok((unix_ms, event)) => {
                        if job.is_some() && event_job(&event) != job {
                            continue;
                        }
                        last = job.is_some() && finishes(&event);
                        event_json(unix_ms, &event).to_string()
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        json!({"type": "lagged", "missed": n}).to_string()
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tokio::time::sleep(KEEPALIVE) => String::new(),
            };
            // A stream ends with what let it in: a session signed out or
            // ended, a ticket rotated (within a keep-alive period).
            if !allowed() || tx.send(frame(line)).await.is_err() || last {
                return;
            }
        }
    });
    stream_response(body, sse)
}

/// The response whose body is what `body` receives: NDJSON, or SSE.
fn stream_response(body: mpsc::Receiver<Bytes>, sse: bool) -> Response<Body> {
    let mut r = Response::new(ChannelBody(body).boxed());
    let kind = if sse {
        "text/event-stream"
    } else {
        "application/x-ndjson"
    };
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    r
}

/// Whether `event` finishes its job (done, failed or canceled).
fn finishes(event: &FarmEvent) -> bool {
    matches!(event, FarmEvent::JobChanged { state, .. } if state.is_final())
}
