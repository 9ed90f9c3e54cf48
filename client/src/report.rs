//! What client commands print: one JSON object with `--json` (the contract
//! scripts rely on), readable lines and tables otherwise.

use std::path::{Path, PathBuf};

use serde_json::json;
use tessera_protocol::build::BuildInfo;
use tessera_protocol::messages::{JobState, JobStatus, WorkerStatus};

use crate::progress::human_bytes;

/// `x` to `places` decimals, so JSON shows `12.9`, not `12.881999999999998`
/// (amounts of money to a hundredth of a cent, seconds to a tenth).
pub fn round(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    let r = (x * scale).round() / scale;
    if r == 0.0 {
        0.0 // never -0
    } else {
        r
    }
}

pub fn job_json(s: &JobStatus) -> serde_json::Value {
    json!({
        "id": s.id,
        "name": s.name,
        "engine": s.engine.name(),
        "state": s.state.name(),
        "priority": s.priority,
        "frames_total": s.frames_total,
        "frames_done": s.frames_done,
        "tasks_total": s.tasks_total,
        "tasks_done": s.tasks_done,
        "tasks_running": s.tasks_running,
        "bytes_uploaded": s.bytes_uploaded,
        "bytes_deduplicated": s.bytes_deduplicated,
        "bytes_to_workers": s.bytes_to_workers,
        "render_ms": s.render_ms,
        "submitted_unix_ms": s.submitted_unix_ms,
        "finished_unix_ms": s.finished_unix_ms,
        "error": s.error,
        "blocked": s.blocked,
        "paused": s.paused,
        "cost_usd": round(s.cost_usd, 4),
        "cost_to_finish_usd": s.cost_to_finish_usd.map(|c| round(c, 4)),
        "eta_secs": s.eta_secs.map(|e| round(e, 1)),
        "after": s.after,
        "after_failure": s.after_failure.name(),
        "waiting_for": s.waiting_for,
        "deadline_unix_ms": s.deadline_unix_ms,
        "budget_usd": s.budget_usd.map(|b| round(b, 4)),
        "verification": s.verification.as_ref().map(|v| json!({
            "percent": v.percent,
            "agreed": v.agreed,
            "mismatched": v.mismatched,
            "pending": v.pending,
            "inconclusive": v.inconclusive,
            "rerendered": v.rerendered,
            "quarantined": v.quarantined,
        })),
    })
}

fn worker_json(w: &WorkerStatus) -> serde_json::Value {
    json!({
        "id": w.id,
        "name": w.name,
        "engines": w.engines.iter().map(|e| e.name()).collect::<Vec<_>>(),
        "slots": w.slots,
        "running": w.running,
        "tasks_done": w.tasks_done,
        "price_per_hour": w.price_per_hour,
        "state": w.state.name(),
        "interruptible": w.interruptible,
        "hostname": w.hostname,
        "blenders": w.blenders.iter().map(|b| json!({
            "name": b.name, "version": b.version.to_string(),
            "device": b.render_device, "devices": b.devices,
            "device_types": b.device_types,
            "oidn": b.oidn, "osl": b.osl, "eevee": b.eevee,
        })).collect::<Vec<_>>(),
        "connected_secs": w.connected_secs,
        "tasks": w.tasks.iter().map(|t| json!({
            "job": t.job, "task": t.index, "frame": t.frame,
            "tile": [t.tile.x, t.tile.y, t.tile.width, t.tile.height],
            "progress": t.progress.map(|(d, n)| json!({"done": d, "total": n, "stage": t.stage})),
        })).collect::<Vec<_>>(),
        "telemetry": w.telemetry.as_ref().map(|t| json!({
            "cpu_model": t.host.cpu_model, "cores": t.host.cores, "load_1m": t.host.load_1m,
            "memory_used_bytes": t.host.memory_used_bytes, "memory_total_bytes": t.host.memory_total_bytes,
            "gpus": t.gpus.iter().map(|g| json!({
                "index": g.index, "name": g.name, "utilization_pct": g.utilization_pct,
                "memory_used_bytes": g.memory_used_bytes, "memory_total_bytes": g.memory_total_bytes,
                "temperature_c": g.temperature_c, "power_draw_w": g.power_draw_w, "power_limit_w": g.power_limit_w,
            })).collect::<Vec<_>>(),
            "gpu_note": t.gpu_note,
        })),
    })
}

pub fn summary_line(s: &JobStatus) -> String {
    format!(
        "{} frames, {} tasks; uploaded {}, deduplicated {}",
        s.frames_total,
        s.tasks_total,
        human_bytes(s.bytes_uploaded),
        human_bytes(s.bytes_deduplicated)
    )
}

/// `tessera logs`: each failed attempt's error line, then its log.
pub fn print_logs(job: u64, logs: &[tessera_protocol::messages::TaskLog], json: bool) {
    if json {
        let list: Vec<_> = logs
            .iter()
            .map(|l| {
                json!({"task": l.task, "worker": l.worker, "unix_ms": l.unix_ms,
                       "error": l.error, "log": l.log})
            })
            .collect();
        println!("{}", json!({ "job": job, "attempts": list }));
        return;
    }
    if logs.is_empty() {
        println!("job {job}: no failed attempts");
    }
    for l in logs {
        let mut l = l.clone();
        crate::shown::task_log(&mut l);
        println!(
            "== job {job} task {} on worker {}: {}",
            l.task, l.worker, l.error
        );
        print!("{}", l.log);
        if !l.log.is_empty() && !l.log.ends_with('\n') {
            println!();
        }
    }
}

/// A submit's answer; with `--json` its warnings are a list under
/// `warnings`, and the job's files under `uploads`: each one's path in the
/// job (`path`), where it was read here (`from`), `size` and `digest`.
pub fn print_submitted(
    s: &JobStatus,
    warnings: &[String],
    files: &[crate::client::JobFile],
    json: bool,
) {
    if json {
        let mut v = job_json(s);
        v["warnings"] = json!(warnings);
        v["uploads"] = json!(files
            .iter()
            .map(|f| json!({
                "path": f.path,
                "from": f.from.to_string_lossy(),
                "size": f.size,
                "digest": f.digest.to_hex(),
            }))
            .collect::<Vec<_>>());
        println!("{v}");
    } else {
        println!("job {} submitted: {}", s.id, summary_line(s));
    }
}

/// A finished job; `warnings` are those of the submit that waited for it.
/// `downloaded`: how many of `files` this run wrote (the others were in
/// place already, with the same bytes).
pub fn print_final(
    s: &JobStatus,
    files: &[PathBuf],
    downloaded: usize,
    warnings: Option<&[String]>,
    json: bool,
) {
    if json {
        let mut v = job_json(s);
        if let Some(w) = warnings {
            v["warnings"] = json!(w);
        }
        v["files"] = json!(files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>());
        println!("{v}");
        return;
    }
    match s.state {
        JobState::Done => {
            println!(
                "job {} done: {} frames, {} tasks",
                s.id, s.frames_done, s.tasks_done
            );
            if let Some(dir) = files.first().and_then(|f| f.parent()) {
                println!("{}", frames_line("frames", files.len(), downloaded, dir));
            }
        }
        _ => eprintln!(
            "error: job {} {}{}",
            s.id,
            s.state.name(),
            s.error
                .as_deref()
                .map(|e| format!(": {}", crate::shown::text(e)))
                .unwrap_or_default()
        ),
    }
}

/// `status JOB`: the job, its frames by state, its workers and its latest
/// failed attempts.
pub fn print_detail(d: &tessera_protocol::messages::JobDetail, json: bool) {
    if json {
        let mut v = job_json(&d.status);
        v["frames"] = json!(d
            .frames
            .iter()
            .map(|r| json!({"first": r.first, "last": r.last, "count": r.count, "state": r.state.name()}))
            .collect::<Vec<_>>());
        v["frames_cut"] = json!(d.frames_cut);
        v["attempts"] = json!(d
            .attempts
            .iter()
            .map(
                |a| json!({"task": a.task, "frame": a.frame, "worker": a.worker,
                            "worker_name": a.worker_name, "unix_ms": a.unix_ms, "error": a.error})
            )
            .collect::<Vec<_>>());
        v["attempts_total"] = json!(d.attempts_total);
        v["warnings"] = json!(d.warnings);
        v["workers"] = json!(d
            .workers
            .iter()
            .map(|w| json!({"name": w.name, "tasks_done": w.tasks_done,
                            "render_ms": w.render_ms, "running": w.running}))
            .collect::<Vec<_>>());
        println!("{v}");
        return;
    }
    let mut s = d.status.clone();
    crate::shown::job(&mut s);
    println!("{}", crate::follow::progress_line(&d.status));
    println!(
        "  priority {}; submitted {}{}; cost ${:.2}{}",
        s.priority,
        utc(s.submitted_unix_ms),
        s.finished_unix_ms
            .map(|f| format!(", finished {}", utc(f)))
            .unwrap_or_default(),
        s.cost_usd,
        s.cost_to_finish_usd
            .map(|c| format!(" (${c:.2} to finish)"))
            .unwrap_or_default()
    );
    if let Some(e) = &s.error {
        println!("  error: {e}");
    }
    for w in &d.warnings {
        println!("  warning at submit: {}", crate::shown::text(w));
    }
    if let Some(v) = &s.verification {
        println!("  {}", verification_note(v));
    }
    let runs: Vec<String> = d
        .frames
        .iter()
        .map(|r| {
            let frames = if r.count == 1 {
                r.first.to_string()
            } else {
                format!("{}-{}", r.first, r.last)
            };
            format!("{frames} {}", r.state.name())
        })
        .collect();
    println!(
        "  frames: {}{}",
        runs.join(", "),
        if d.frames_cut { ", …" } else { "" }
    );
    if d.workers.is_empty() {
        println!("  workers: none yet");
    }
    for w in &d.workers {
        println!(
            "  worker {}: {} tasks done ({:.1} s rendering){}",
            crate::shown::text(&w.name),
            w.tasks_done,
            w.render_ms as f64 / 1000.0,
            if w.running > 0 {
                format!(", {} running", w.running)
            } else {
                String::new()
            }
        );
    }
    if d.attempts_total > 0 {
        println!(
            "  failed attempts: {} (latest {} below; `tessera logs {}` shows their logs)",
            d.attempts_total,
            d.attempts.len(),
            s.id
        );
    }
    for a in &d.attempts {
        println!(
            "    task {}{} on {} at {}: {}",
            a.task,
            a.frame.map(|f| format!(" (frame {f})")).unwrap_or_default(),
            a.worker_name
                .as_deref()
                .map(crate::shown::text)
                .unwrap_or_else(|| format!("worker {}", a.worker)),
            utc(a.unix_ms),
            crate::shown::text(&a.error)
        );
    }
}

/// Unix milliseconds as `2026-12-01 09:30:00 UTC`.
pub fn utc(unix_ms: u64) -> String {
    let secs = (unix_ms / 1000) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// How a `wait` ended: each job as [`print_final`] shows it, and a line
/// on stderr when the time ran out first.
pub fn print_waited(
    w: &crate::follow::Waited,
    warnings: Option<&[String]>,
    json: bool,
    timeout: Option<std::time::Duration>,
) {
    if json {
        let mut list: Vec<serde_json::Value> = w
            .jobs
            .iter()
            .map(|(s, files)| {
                let mut v = job_json(s);
                v["files"] = json!(files
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>());
                v
            })
            .collect();
        let mut v = if list.len() == 1 {
            list.pop().expect("one job")
        } else {
            json!({ "jobs": list })
        };
        if let Some(warn) = warnings {
            v["warnings"] = json!(warn);
        }
        if w.timed_out {
            v["timed_out"] = json!(true);
        }
        println!("{v}");
    } else {
        for ((s, files), &downloaded) in w.jobs.iter().zip(&w.downloaded) {
            if s.state.is_final() {
                print_final(s, files, downloaded, None, false);
                if s.state != JobState::Done && !files.is_empty() {
                    if let Some(dir) = files.first().and_then(|f| f.parent()) {
                        let line = frames_line("finished frames", files.len(), downloaded, dir);
                        println!("{line}");
                    }
                }
            }
        }
    }
    if w.timed_out {
        let pending: Vec<String> = (w.jobs.iter())
            .filter(|(s, _)| !s.state.is_final())
            .map(|(s, _)| crate::follow::progress_line(s))
            .collect();
        eprintln!(
            "error: timed out after {}: {} (the jobs go on)",
            timeout.map_or("the timeout".into(), |t| format!("{} s", t.as_secs_f64())),
            pending.join("; ")
        );
    }
}

/// `after 3,7 (hold)`: the jobs a job runs after, and what it does when
/// one fails when that is not the default.
pub fn after_note(s: &JobStatus) -> Option<String> {
    if s.after.is_empty() {
        return None;
    }
    let jobs: Vec<String> = s.after.iter().map(u64::to_string).collect();
    let hold = match s.after_failure {
        tessera_protocol::job::AfterFailure::Hold => " (hold)",
        tessera_protocol::job::AfterFailure::Fail => "",
    };
    Some(format!("after {}{hold}", jobs.join(",")))
}

/// A checked job's verification results, in one line.
fn verification_note(v: &tessera_protocol::messages::Verification) -> String {
    let mut note = format!(
        "verify {}%: {} agreed, {} mismatched, {} pending",
        v.percent, v.agreed, v.mismatched, v.pending
    );
    if v.rerendered > 0 {
        note += &format!(", {} re-rendered", v.rerendered);
    }
    if !v.quarantined.is_empty() {
        let names: Vec<String> = v
            .quarantined
            .iter()
            .map(|n| crate::shown::text(n))
            .collect();
        note += &format!(", quarantined: {}", names.join(", "));
    }
    note
}

pub fn print_status(job: Option<u64>, jobs: &[JobStatus], workers: &[WorkerStatus], json: bool) {
    if json {
        match job {
            Some(_) => println!("{}", job_json(&jobs[0])),
            None => println!(
                "{}",
                json!({
                    "jobs": jobs.iter().map(job_json).collect::<Vec<_>>(),
                    "workers": workers.iter().map(worker_json).collect::<Vec<_>>(),
                })
            ),
        }
        return;
    }
    // Names and errors as the terminal should show them.
    let mut jobs = jobs.to_vec();
    jobs.iter_mut().for_each(crate::shown::job);
    let mut workers = workers.to_vec();
    workers.iter_mut().for_each(crate::shown::worker);
    let (jobs, workers) = (&jobs[..], &workers[..]);
    println!(
        "{:<5} {:<24} {:<9} {:>13} {:>13}  NOTE",
        "JOB", "NAME", "STATE", "FRAMES", "TASKS"
    );
    for s in jobs {
        let note = after_note(s)
            .into_iter()
            .chain(
                (s.error.clone()).or_else(|| s.blocked.as_ref().map(|b| format!("blocked: {b}"))),
            )
            .chain(s.verification.as_ref().map(verification_note))
            .collect::<Vec<_>>()
            .join("; ");
        println!(
            "{:<5} {:<24} {:<9} {:>13} {:>13}  {}",
            s.id,
            truncate(&s.name, 24),
            s.state.name(),
            format!("{}/{}", s.frames_done, s.frames_total),
            format!("{}/{}", s.tasks_done, s.tasks_total),
            truncate(&note, 60)
        );
    }
    if jobs.is_empty() {
        println!("(no jobs)");
    }
    if job.is_none() {
        println!();
        println!(
            "{:<5} {:<24} {:<16} {:>7} {:>12} {:>10}",
            "ID", "WORKER", "ENGINES", "SLOTS", "RUNNING", "DONE"
        );
        for w in workers {
            let engines: Vec<_> = w.engines.iter().map(|e| e.name()).collect();
            // Spot / interruptible nodes are marked: they may vanish.
            let name = if w.interruptible {
                format!("{} (spot)", w.name)
            } else {
                w.name.clone()
            };
            println!(
                "{:<5} {:<24} {:<16} {:>7} {:>12} {:>10}",
                w.id,
                truncate(&name, 24),
                engines.join(","),
                w.slots,
                running_text(w),
                w.tasks_done
            );
        }
        if workers.is_empty() {
            println!("(no workers connected)");
        }
        for w in workers.iter().filter(|w| !w.blenders.is_empty()) {
            for b in &w.blenders {
                println!(
                    "      {}: {} renders on {}{}",
                    w.name,
                    b.name,
                    b.render_device,
                    blender_features(b)
                );
            }
        }
    }
}

/// `; OpenImageDenoise, OSL, Eevee` for what a Blender has.
pub fn blender_features(b: &tessera_protocol::blender::BlenderOffer) -> String {
    let has: Vec<&str> = [
        (b.oidn, "OpenImageDenoise"),
        (b.osl, "OSL"),
        (b.eevee, "Eevee"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    if has.is_empty() {
        String::new()
    } else {
        format!("; {}", has.join(", "))
    }
}

/// Running tasks, with the samples of the first one when reported: `1 (12/64)`.
fn running_text(w: &WorkerStatus) -> String {
    let first = w.tasks.first();
    match (
        first.and_then(|t| t.progress),
        first.and_then(|t| t.stage.as_deref()),
    ) {
        (Some(_), Some(stage)) => format!("{} ({})", w.running, truncate(stage, 40)),
        (Some((done, total)), None) => format!("{} ({done}/{total})", w.running),
        (None, _) => w.running.to_string(),
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

pub fn build_json(b: &BuildInfo) -> serde_json::Value {
    json!({
        "digest": b.digest.to_hex(),
        "version": b.version.to_string(),
        "kind": b.kind.name(),
        "size": b.size,
        "files": b.files,
        "features": b.features,
        "added_unix_ms": b.added_unix_ms,
        "holders": b.holders,
    })
}

/// `blender add`: the build, and what its upload sent.
pub fn print_build_added(a: &crate::build::Added, json: bool) {
    if json {
        let mut v = build_json(&a.info);
        v["uploaded_bytes"] = json!(a.uploaded);
        v["manifest_bytes"] = json!(a.manifest);
        println!("{v}");
        return;
    }
    let b = &a.info;
    println!(
        "Blender {} ({}, {} in {} files) stored as {}; uploaded {} of {}",
        b.version,
        b.kind.name(),
        human_bytes(b.size),
        b.files,
        b.digest.to_hex(),
        human_bytes(a.uploaded + a.manifest),
        human_bytes(b.size),
    );
}

/// `blender list`.
pub fn print_builds(builds: &[BuildInfo], json: bool) {
    if json {
        let list: Vec<_> = builds.iter().map(build_json).collect();
        println!("{}", json!({ "builds": list }));
        return;
    }
    if builds.is_empty() {
        println!("no Blender builds; add one with `tessera blender add PATH`");
        return;
    }
    println!(
        "{:<9} {:<11} {:>10} {:>7}  {:<28} {:<16}  HELD BY",
        "VERSION", "KIND", "SIZE", "FILES", "FEATURES", "DIGEST"
    );
    for b in builds {
        let holders: Vec<String> = b.holders.iter().map(|h| crate::shown::text(h)).collect();
        println!(
            "{:<9} {:<11} {:>10} {:>7}  {:<28} {}  {}",
            b.version.to_string(),
            b.kind.name(),
            human_bytes(b.size),
            b.files,
            b.features.join(", "),
            &b.digest.to_hex()[..16],
            if holders.is_empty() {
                "-".to_string()
            } else {
                holders.join(", ")
            },
        );
    }
}

/// How a feed of `tessera events` ended.
pub enum FeedEnd {
    /// As asked: the job's final event printed, or stdout closed.
    Done,
    /// The connection broke or the coordinator closed the feed (a restart,
    /// a standby taking over): the caller may subscribe again.
    Lost(anyhow::Error),
}

/// `tessera events`: every farm event from the feed (of one job, with
/// `job`), one line each: NDJSON with `json`, else `TYPE key=value …`.
/// One job's ends after the event that finishes the job; every job's when
/// the feed ends.
pub async fn stream_events(mut feed: crate::client::Feed, job: Option<u64>, json: bool) -> FeedEnd {
    use std::io::Write;
    use tessera_protocol::events::event_job;
    use tessera_protocol::messages::{ClientResponse, FarmEvent};
    let mut out = std::io::stdout();
    loop {
        let msg = match feed.next().await {
            Ok(Some(msg)) => msg,
            Ok(None) => {
                return FeedEnd::Lost(anyhow::anyhow!("the coordinator closed the event feed"))
            }
            Err(e) => return FeedEnd::Lost(e),
        };
        let ClientResponse::Event { unix_ms, event } = msg else {
            continue;
        };
        if job.is_some() && event_job(&event) != job {
            continue;
        }
        // One job's stream ends with the event that finishes it.
        let last = job.is_some()
            && matches!(&event, FarmEvent::JobChanged { state, .. } if state.is_final());
        let line = event_line(unix_ms, &event, json);
        // A closed stdout (`| head`) ends the stream quietly.
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() || last {
            return FeedEnd::Done;
        }
    }
}

/// One event as `events` prints it: its JSON, or its type and fields.
pub fn event_line(
    unix_ms: u64,
    event: &tessera_protocol::messages::FarmEvent,
    json: bool,
) -> String {
    let value = tessera_protocol::events::event_json(unix_ms, event);
    if json {
        return value.to_string();
    }
    let mut line = value["type"].as_str().unwrap_or("event").to_string();
    for (k, v) in value.as_object().into_iter().flatten() {
        if k != "type" && k != "unix_ms" {
            let v = match v {
                serde_json::Value::String(s) => crate::shown::text(s),
                other => other.to_string(),
            };
            line += &format!(" {k}={v}");
        }
    }
    line
}

/// What a fetch did, counted: `4 frames written to DIR`, or on a rerun
/// `0 frames written to DIR (4 already there)`.
fn frames_line(what: &str, files: usize, downloaded: usize, dir: &Path) -> String {
    let there = files - downloaded.min(files);
    let mut line = format!("{downloaded} {what} written to {}", dir.display());
    if there > 0 {
        line += &format!(" ({there} already there)");
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fetch_counts_the_frames_it_wrote_not_those_in_place() {
        let dir = Path::new("shots/sh010");
        assert_eq!(
            frames_line("frames", 4, 4, dir),
            "4 frames written to shots/sh010"
        );
        assert_eq!(
            frames_line("frames", 4, 0, dir),
            "0 frames written to shots/sh010 (4 already there)"
        );
        assert_eq!(
            frames_line("frames", 4, 1, dir),
            "1 frames written to shots/sh010 (3 already there)"
        );
    }

    #[test]
    fn json_figures_are_rounded_and_never_negative_zero() {
        assert_eq!(round(12.881999999999998, 1), 12.9);
        assert_eq!(round(0.123456789, 4), 0.1235);
        assert!(round(-0.0, 4).is_sign_positive());
        assert!(round(-0.00001, 4).is_sign_positive());
        let mut s = JobStatus {
            id: 1,
            name: "sh010".into(),
            engine: tessera_protocol::job::Engine::Builtin,
            state: JobState::Running,
            priority: 0,
            frames_total: 1,
            frames_done: 0,
            tasks_total: 1,
            tasks_done: 0,
            tasks_running: 0,
            bytes_uploaded: 0,
            bytes_deduplicated: 0,
            bytes_to_workers: 0,
            render_ms: 0,
            submitted_unix_ms: 0,
            finished_unix_ms: None,
            error: None,
            blocked: None,
            cost_usd: 0.0,
            cost_to_finish_usd: None,
            eta_secs: None,
            paused: false,
            verification: None,
            after: Vec::new(),
            after_failure: Default::default(),
            waiting_for: Vec::new(),
            deadline_unix_ms: None,
            budget_usd: None,
        };
        s.eta_secs = Some(12.881999999999998);
        s.cost_usd = 0.1 + 0.2;
        s.cost_to_finish_usd = Some(-0.0);
        let v = job_json(&s).to_string();
        assert!(v.contains(r#""eta_secs":12.9"#), "{v}");
        assert!(v.contains(r#""cost_usd":0.3,"#), "{v}");
        assert!(v.contains(r#""cost_to_finish_usd":0.0"#), "{v}");
        assert_eq!(utc(1_796_117_400_000), "2026-12-01 09:30:00 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }
}
