//! Farm events as JSON, one object per event: what `tessera events --json`
//! prints (NDJSON), what the HTTP API's `/v1/events` streams and what a
//! webhook's body carries. Flat objects with a `type` (`task.started`,
//! `job.done`, …) rather than serde's enum shape, so a script reads
//! `event["type"]` and `event["job"]`.

use serde_json::{json, Value};

use crate::messages::{FarmEvent, JobState};

/// The `type` of a job event in `state`: `job.queued` (submitted),
/// `job.running` (its first task started), `job.done`, `job.failed`,
/// `job.canceled`. A pause or resume is `job.paused` or `job.resumed`.
pub fn job_event_type(state: JobState) -> String {
    format!("job.{}", state.name())
}

/// One event as a flat JSON object.
pub fn event_json(unix_ms: u64, event: &FarmEvent) -> Value {
    let mut v = match event {
        FarmEvent::WorkerJoined { worker, name } => {
            json!({"type": "worker.joined", "worker": worker, "name": name})
        }
        FarmEvent::WorkerLeft { worker, name } => {
            json!({"type": "worker.left", "worker": worker, "name": name})
        }
        FarmEvent::TaskStarted { job, index, worker } => {
            json!({"type": "task.started", "job": job, "task": index, "worker": worker})
        }
        FarmEvent::TaskFinished {
            job,
            index,
            worker,
            render_ms,
        } => json!({
            "type": "task.finished", "job": job, "task": index, "worker": worker,
            "render_ms": render_ms,
        }),
        FarmEvent::TaskFailed {
            job,
            index,
            worker,
            error,
        } => json!({
            "type": "task.failed", "job": job, "task": index, "worker": worker, "error": error,
        }),
        FarmEvent::JobChanged { job, state } => {
            json!({"type": job_event_type(*state), "job": job, "state": state.name()})
        }
        FarmEvent::JobHeld { job, paused } => {
            let kind = if *paused { "job.paused" } else { "job.resumed" };
            json!({"type": kind, "job": job, "paused": paused})
        }
    };
    v["unix_ms"] = json!(unix_ms);
    v
}

/// The job an event is about, if any (for a per-job filter).
pub fn event_job(event: &FarmEvent) -> Option<u64> {
    match event {
        FarmEvent::WorkerJoined { .. } | FarmEvent::WorkerLeft { .. } => None,
        FarmEvent::TaskStarted { job, .. }
        | FarmEvent::TaskFinished { job, .. }
        | FarmEvent::TaskFailed { job, .. }
        | FarmEvent::JobChanged { job, .. }
        | FarmEvent::JobHeld { job, .. } => Some(*job),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_flat_objects_with_a_type() {
        let e = FarmEvent::JobChanged {
            job: 3,
            state: JobState::Done,
        };
        let v = event_json(7, &e);
        assert_eq!(v["type"], "job.done");
        assert_eq!(v["job"], 3);
        assert_eq!(v["unix_ms"], 7);
        assert_eq!(event_job(&e), Some(3));
        let held = |paused| event_json(7, &FarmEvent::JobHeld { job: 3, paused });
        assert_eq!(held(true)["type"], "job.paused");
        assert_eq!(held(false)["type"], "job.resumed");
        assert_eq!(held(false)["job"], 3);
    }
}
