//! Webhooks (`coordinator --webhook URL`): job `done`, `failed`, `blocked`
//! and `budget_reached` events POSTed to a receiver as JSON, signed with HMAC-SHA256
//! (`X-Tessera-Signature: sha256=HEX` over the body), each with an id
//! (`X-Tessera-Event-Id`, and `id` in the body) that stays the same on every
//! retry, so a receiver deduplicates by it.
//!
//! Events go into an outbox table in the coordinator's SQLite before any
//! delivery, and leave it (marked delivered) only on a 2xx answer; a failed
//! delivery is retried with exponential backoff, in order, across receiver
//! outages and coordinator restarts. An event is keyed by what it is about
//! (`job.done:7`), so noticing it twice (from the live feed and from the
//! catch-up a start runs over the jobs that finished while no one listened)
//! queues it once. A job's `blocked` event is sent once per job, the first
//! time it is seen blocked, and its `budget_reached` event once, when what
//! it cost reaches its `--budget-usd` (whatever `--on-budget` then does).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use serde_json::{json, Value};
use tessera_protocol::events::job_event_type;
use tessera_protocol::messages::{JobState, JobStatus};
use tokio::sync::broadcast;

use crate::config::Webhook;
use crate::db::sql::{args, Sql};
use crate::db::DbError;
use crate::server::{unix_ms, Notice, Shared};

/// How long one delivery may take, connecting included.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// A receiver's address, from an `http://HOST:PORT/PATH` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl Target {
    /// The URL to POST to, as parsed (an IPv6 host in brackets again).
    pub fn url(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!("http://{host}:{}{}", self.port, self.path)
    }
}

/// Parses a webhook URL; only `http://` is spoken (put a TLS-terminating
/// proxy in front of an `https://` receiver).
pub fn parse_url(url: &str) -> anyhow::Result<Target> {
    let Some(rest) = url.strip_prefix("http://") else {
        bail!("webhook URL `{url}`: only http:// URLs are supported (for an https receiver, point the webhook at a local TLS proxy)");
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (
            h,
            p.parse()
                .with_context(|| format!("webhook URL `{url}`: bad port `{p}`"))?,
        ),
        _ => (authority, 80),
    };
    if host.is_empty() {
        bail!("webhook URL `{url}` names no host");
    }
    Ok(Target {
        host: host.trim_matches(|c| c == '[' || c == ']').to_string(),
        port,
        path: path.to_string(),
    })
}

/// `sha256=HEX`: the signature header's value for `body`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let tag = ring::hmac::sign(&key, body);
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// A job put back in the queue (`retry`) may end again: its delivered
/// `job.done`, `job.failed` and `job.blocked` events are forgotten, so its
/// next ending (or block) is told too. Nothing when webhooks were never on.
pub(crate) fn forget_endings(conn: &Sql, job: u64) -> Result<(), DbError> {
    conn.execute(
        "DELETE FROM webhook_outbox WHERE key IN (?1, ?2, ?3) AND delivered_ms IS NOT NULL",
        &args![
            format!("job.done:{job}"),
            format!("job.failed:{job}"),
            format!("job.blocked:{job}")
        ],
    )?;
    Ok(())
}

/// Queues an event once per key; true when it was new. A key already
/// queued costs a read, never a write (an ignored insert into an
/// `AUTOINCREMENT` table still writes).
fn enqueue(shared: &Shared, key: &str, body: &Value) -> anyhow::Result<bool> {
    let db = shared.db();
    let known = (db.sql())
        .query_opt("SELECT 1 FROM webhook_outbox WHERE key = ?1", &args![key])?
        .is_some();
    if known {
        return Ok(false);
    }
    let n = db.sql().execute(
        "INSERT INTO webhook_outbox (key, body, created_ms) VALUES (?1, ?2, ?3)
         ON CONFLICT DO NOTHING",
        &args![key, body.to_string(), unix_ms() as i64],
    )?;
    if n > 0 {
        tracing::info!(%key, "webhook event queued");
    }
    Ok(n > 0)
}

/// The body of a job event (without its `id`, added when it is sent).
fn job_body(kind: &str, state: JobState, status: Option<&JobStatus>, job: u64) -> Value {
    let mut v = json!({
        "type": kind,
        "job": job,
        "state": state.name(),
        "unix_ms": unix_ms(),
    });
    if let Some(s) = status {
        v["name"] = json!(s.name);
        v["frames_done"] = json!(s.frames_done);
        v["frames_total"] = json!(s.frames_total);
        v["tasks_done"] = json!(s.tasks_done);
        v["tasks_total"] = json!(s.tasks_total);
        v["cost_usd"] = json!((s.cost_usd * 1e4).round() / 1e4);
        v["budget_usd"] = json!(s.budget_usd);
        v["error"] = json!(s.error);
        v["blocked"] = json!(s.blocked);
        v["finished_unix_ms"] = json!(s.finished_unix_ms);
    }
    v
}

/// Queues the `done` or `failed` event of a job that ended, built from
/// its final status (counts, error, end time) as the farm core told it.
fn job_ended(shared: &Shared, status: &JobStatus) -> anyhow::Result<()> {
    // (A budget reached is told by the farm core, with the status of that
    // moment: see `noticed`.)
    if !matches!(status.state, JobState::Done | JobState::Failed) {
        return Ok(());
    }
    let kind = job_event_type(status.state);
    enqueue(
        shared,
        &format!("{kind}:{}", status.id),
        &job_body(&kind, status.state, Some(status), status.id),
    )?;
    Ok(())
}

/// Queues the events of jobs that finished since webhooks were first turned
/// on and were not queued (the coordinator stopped between the two).
fn catch_up(shared: &Shared, since_ms: u64) -> anyhow::Result<()> {
    let finished = shared.db().finished_jobs(10_000)?;
    for stored in finished {
        let status = stored.status();
        if status.finished_unix_ms.is_some_and(|t| t >= since_ms) {
            if budget_reached(&status) {
                enqueue_budget_reached(shared, &status)?;
            }
            let kind = job_event_type(status.state);
            if matches!(status.state, JobState::Done | JobState::Failed) {
                enqueue(
                    shared,
                    &format!("{kind}:{}", status.id),
                    &job_body(&kind, status.state, Some(&status), status.id),
                )?;
            }
        }
    }
    Ok(())
}

/// What the job cost has reached its budget.
fn budget_reached(job: &JobStatus) -> bool {
    job.budget_usd.is_some_and(|budget| job.cost_usd >= budget)
}

fn enqueue_budget_reached(shared: &Shared, job: &JobStatus) -> anyhow::Result<()> {
    enqueue(
        shared,
        &format!("job.budget_reached:{}", job.id),
        &job_body("job.budget_reached", job.state, Some(job), job.id),
    )?;
    Ok(())
}

/// Queues the event the farm core told of, with the job's status at that
/// moment: `blocked` (its reason), `budget_reached`, `done` or `failed`.
fn noticed(shared: &Shared, notice: Notice) -> anyhow::Result<()> {
    match notice {
        // A job the budget canceled is gone from the core before it is
        // recorded: its status is the one of that moment.
        Notice::BudgetReached(status) => enqueue_budget_reached(shared, &status),
        Notice::Ended(status) => job_ended(shared, &status),
        Notice::Blocked(status) => {
            if status.blocked.is_some() && !status.state.is_final() {
                enqueue(
                    shared,
                    &format!("job.blocked:{}", status.id),
                    &job_body("job.blocked", status.state, Some(&status), status.id),
                )?;
            }
            Ok(())
        }
    }
}

/// Queues the `blocked` and `budget_reached` events the farm's jobs call
/// for now (each once per job: the outbox is keyed by it). A scan over
/// every job: only at start, and after missing notices.
fn blocked(shared: &Shared) -> anyhow::Result<()> {
    let (jobs, holding): (Vec<JobStatus>, bool) =
        shared.read(|core, now| (core.snapshot(now).jobs, core.holding_for_rejoin(now)));
    for j in jobs.iter().filter(|j| budget_reached(j)) {
        enqueue_budget_reached(shared, j)?;
    }
    // Just started, with workers still to rejoin: a job lacking them is
    // not blocked; the farm core tells of those still blocked once the
    // hold ends (this task is listening by then).
    if holding {
        return Ok(());
    }
    for j in jobs
        .iter()
        .filter(|j| j.blocked.is_some() && !j.state.is_final())
    {
        enqueue(
            shared,
            &format!("job.blocked:{}", j.id),
            &job_body("job.blocked", j.state, Some(j), j.id),
        )?;
    }
    Ok(())
}

/// Marks event `id` delivered, or failed once more and due again after
/// `backoff`.
fn mark(shared: &Shared, id: i64, delivered: bool, backoff: Duration) -> anyhow::Result<()> {
    let db = shared.db();
    if delivered {
        db.sql().execute(
            "UPDATE webhook_outbox SET delivered_ms = ?1, attempts = attempts + 1 WHERE id = ?2",
            &args![unix_ms() as i64, id],
        )?;
    } else {
        db.sql().execute(
            "UPDATE webhook_outbox SET attempts = attempts + 1, next_ms = ?1 WHERE id = ?2",
            &args![(unix_ms() + backoff.as_millis() as u64) as i64, id],
        )?;
    }
    Ok(())
}

/// The most of a receiver's answer body read (the rest is dropped).
const MAX_ANSWER_BODY: usize = 64 * 1024;

/// When the next undelivered event is due (unix ms), if any.
fn next_due(shared: &Shared) -> anyhow::Result<Option<u64>> {
    let db = shared.db();
    // Events go out in order: the oldest is the next to go, whenever the
    // others would be due (taking the earliest of them made the loop spin
    // while the oldest waited out its backoff).
    let due = db.sql().query_opt(
        "SELECT next_ms FROM webhook_outbox WHERE delivered_ms IS NULL ORDER BY id LIMIT 1",
        &[],
    )?;
    Ok(due.map(|r| r.int(0)).transpose()?.map(|d| d.max(0) as u64))
}

/// The oldest undelivered event: id, body, attempts, when it is due.
fn next_pending(shared: &Shared) -> anyhow::Result<Option<(i64, String, u32, u64)>> {
    let db = shared.db();
    let row = db.sql().query_opt(
        "SELECT id, body, attempts, next_ms FROM webhook_outbox
         WHERE delivered_ms IS NULL ORDER BY id LIMIT 1",
        &[],
    )?;
    Ok(row
        .map(|r| -> Result<_, DbError> { Ok((r.int(0)?, r.text(1)?, r.u32(2)?, r.u64(3)?)) })
        .transpose()?)
}

/// POSTs `body` to the receiver with ureq (the fleet's HTTP client too)
/// on a blocking thread: plain HTTP/1.1, no proxy, no redirect, the whole
/// exchange within [`DELIVERY_TIMEOUT`]; answers the status.
async fn post(target: &Target, body: Bytes, headers: &[(&str, String)]) -> anyhow::Result<u16> {
    let url = target.url();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(DELIVERY_TIMEOUT))
        .max_redirects(0)
        .proxy(None)
        .user_agent("tessera-coordinator")
        .build()
        .into();
    let mut req = agent
        .post(&url)
        .header("content-type", "application/json")
        .header("connection", "close");
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    tokio::task::spawn_blocking(move || -> anyhow::Result<u16> {
        let mut response = req
            .send(&body[..])
            .with_context(|| format!("cannot deliver to {url}"))?;
        let status = response.status().as_u16();
        // The receiver's body says nothing we use: a little of it is read
        // (so a short answer completes), never all of a huge one.
        let mut answer = Vec::new();
        let _ = std::io::Read::read_to_end(
            &mut std::io::Read::take(response.body_mut().as_reader(), MAX_ANSWER_BODY as u64),
            &mut answer,
        );
        Ok(status)
    })
    .await?
}

/// Delivers the outbox until its task is aborted.
pub(crate) async fn deliver(shared: Arc<Shared>, hook: Webhook) {
    if let Err(e) = run(&shared, &hook).await {
        tracing::error!("webhooks stopped: {e:#}");
    }
}

async fn run(shared: &Arc<Shared>, hook: &Webhook) -> anyhow::Result<()> {
    let target = parse_url(&hook.url)?;
    let since_ms = shared
        .blocking(|shared| -> anyhow::Result<u64> {
            let db = shared.db();
            db.sql().execute(
                "INSERT INTO webhook_meta (k, v) VALUES ('since_ms', ?1) ON CONFLICT DO NOTHING",
                &args![unix_ms() as i64],
            )?;
            Ok((db.sql())
                .query_one("SELECT v FROM webhook_meta WHERE k = 'since_ms'", &[])?
                .u64(0)?)
        })
        .await??;
    let mut notices = shared.notices();
    shared.blocking(move |s| catch_up(s, since_ms)).await??;
    // Jobs blocked before this task listened; from here on the farm core
    // tells of each newly blocked job.
    shared.blocking(|s| blocked(s)).await??;
    // Nothing is looked at on a timer: the loop wakes for a notice (the
    // farm core's, with the job's status of that moment), or when the next delivery (or retry) is due. The database
    // is read and written on the blocking pool.
    loop {
        deliver_due(shared, hook, &target).await?;
        let due = shared.blocking(|s| next_due(s)).await??;
        let wait = due.map(|at| Duration::from_millis(at.saturating_sub(unix_ms())));
        tokio::select! {
            notice = notices.recv() => match notice {
                Ok(notice) => shared.blocking(move |s| noticed(s, notice)).await??,
                // Missed notices: the jobs that ended are in the database,
                // the blocked ones in the core.
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    shared.blocking(move |s| catch_up(s, since_ms)).await??;
                    shared.blocking(|s| blocked(s)).await??
                }
                Err(broadcast::error::RecvError::Closed) => return Ok(()),
            },
            () = sleep_or_never(wait) => {}
        }
    }
}

async fn sleep_or_never(wait: Option<Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait).await,
        None => std::future::pending().await,
    }
}

/// The wait before retrying an event that failed `attempts` times before:
/// `first_backoff` doubling up to `max_backoff` (the outbox keeps the count,
/// so the schedule is walked to it).
fn retry_wait(hook: &Webhook, attempts: u32) -> Duration {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::new()
        .with_min_delay(hook.first_backoff)
        .with_max_delay(hook.max_backoff)
        .without_max_times()
        .build()
        .nth(attempts.min(64) as usize)
        .unwrap_or(hook.max_backoff)
}

/// Sends the outbox's due events, oldest first, until one fails or none is
/// due.
async fn deliver_due(shared: &Arc<Shared>, hook: &Webhook, target: &Target) -> anyhow::Result<()> {
    while let Some((id, body, attempts, next_ms)) = shared.blocking(|s| next_pending(s)).await?? {
        if next_ms > unix_ms() {
            return Ok(());
        }
        let mut value: Value = serde_json::from_str(&body)?;
        value["id"] = json!(id);
        let kind = value["type"].as_str().unwrap_or("").to_string();
        let bytes = Bytes::from(value.to_string());
        let headers = [
            ("x-tessera-event", kind.clone()),
            ("x-tessera-event-id", id.to_string()),
            ("x-tessera-signature", signature(&hook.secret, &bytes)),
        ];
        let outcome = tokio::time::timeout(DELIVERY_TIMEOUT, post(target, bytes, &headers)).await;
        let failure = match outcome {
            Ok(Ok(status)) if (200..300).contains(&status) => None,
            Ok(Ok(status)) => Some(format!("the receiver answered {status}")),
            Ok(Err(e)) => Some(format!("{e:#}")),
            Err(_) => Some("the receiver did not answer in time".into()),
        };
        let backoff = retry_wait(hook, attempts);
        let marked = failure.is_none();
        shared
            .blocking(move |s| mark(s, id, marked, backoff))
            .await??;
        match failure {
            None => tracing::info!(id, %kind, "webhook delivered"),
            Some(why) => {
                tracing::warn!(
                    id, %kind, attempt = attempts + 1, retry_in_ms = backoff.as_millis() as u64,
                    "webhook delivery failed: {why}"
                );
                return Ok(());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("http://127.0.0.1:8080/hook").unwrap(),
            Target {
                host: "127.0.0.1".into(),
                port: 8080,
                path: "/hook".into()
            }
        );
        assert_eq!(parse_url("http://example.test").unwrap().port, 80);
        let e = parse_url("https://x/").unwrap_err().to_string();
        assert!(e.contains("only http://"), "{e}");
    }

    #[test]
    fn signature_is_hmac_sha256() {
        // RFC 4231, test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
