//! What the farm sends, made safe to show on a terminal: every name,
//! error and note a worker or client chose has its control characters
//! escaped (see [`escape_controls`]) before a table or the monitor prints
//! it, so a job called "a\n\x1b[2J" is shown as `a\n\u{1b}[2J` instead of
//! clearing the screen. JSON output needs none of this: it is escaped
//! already.

use tessera_protocol::messages::{FarmEvent, JobStatus, TaskLog, WorkerStatus};
use tessera_protocol::text::escape_controls;

fn escape(s: &mut String) {
    if let std::borrow::Cow::Owned(escaped) = escape_controls(s) {
        *s = escaped;
    }
}

pub fn job(j: &mut JobStatus) {
    escape(&mut j.name);
    j.error.iter_mut().for_each(escape);
    j.blocked.iter_mut().for_each(escape);
}

pub fn worker(w: &mut WorkerStatus) {
    escape(&mut w.name);
    escape(&mut w.hostname);
    for b in &mut w.blenders {
        escape(&mut b.name);
        escape(&mut b.render_device);
        b.devices.iter_mut().for_each(escape);
        b.device_types.iter_mut().for_each(escape);
    }
    if let Some(t) = &mut w.telemetry {
        escape(&mut t.host.cpu_model);
        t.gpu_note.iter_mut().for_each(escape);
        for g in &mut t.gpus {
            escape(&mut g.name);
        }
    }
}

pub fn event(e: &mut FarmEvent) {
    match e {
        FarmEvent::WorkerJoined { name, .. } | FarmEvent::WorkerLeft { name, .. } => escape(name),
        FarmEvent::TaskFailed { error, .. } => escape(error),
        _ => {}
    }
}

/// A failed attempt's error line; its log keeps newlines and tabs (it is
/// many lines) but loses every other control character.
pub fn task_log(l: &mut TaskLog) {
    escape(&mut l.error);
    if l.log
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        let mut out = String::with_capacity(l.log.len());
        for c in l.log.chars() {
            if !c.is_control() || c == '\n' || c == '\t' {
                out.push(c);
            } else {
                out.extend(c.escape_default());
            }
        }
        l.log = out;
    }
}

/// Any other text from the farm (an error reply, a reason).
pub fn text(s: &str) -> String {
    escape_controls(s).into_owned()
}
