//! Which jobs match a [`JobFilter`] (`tessera status --state … --name …
//! --since … IDS`, and the HTTP API's job list): the database narrows the
//! rows by id, submit time and final state, the farm core gives the live
//! status of active jobs, and the filter decides on what a user sees. One
//! page at a time, oldest first, so a long history is read in bounded
//! steps with the database lock held briefly.

use std::collections::HashSet;

use tessera_protocol::messages::{
    take_page, Attempt, FrameRun, FrameState, JobDetail, JobFilter, JobState, JobStatus, JobWorker,
    MAX_DETAIL_ATTEMPTS, MAX_DETAIL_RUNS, PAGE_ITEMS,
};

use crate::db::{JobRows, StoredJob};
use crate::server::Shared;

/// The most rows one call reads from the database before it answers with
/// what it found and a cursor (a filter matching few of many jobs still
/// answers promptly).
pub const SCAN_ROWS: u32 = 4096;

/// One page of the jobs matching `filter` with ids above `after`, oldest
/// first, and the cursor to ask with next (`None`: no more). A page can be
/// short, or even empty, with a cursor: the scan stopped at [`SCAN_ROWS`].
pub fn jobs_page(
    shared: &Shared,
    filter: &JobFilter,
    after: u64,
) -> anyhow::Result<(Vec<JobStatus>, Option<u64>)> {
    filter.check().map_err(anyhow::Error::msg)?;
    let rows = JobRows::for_filter(filter);
    let mut matched = Vec::new();
    let mut cursor = after;
    let mut scanned = 0u32;
    let mut exhausted = false;
    while matched.len() <= PAGE_ITEMS && scanned < SCAN_ROWS {
        let batch = shared.db().jobs_where(&rows, cursor, PAGE_ITEMS as u32)?;
        scanned += batch.len() as u32;
        if batch.len() < PAGE_ITEMS {
            exhausted = true;
        }
        let Some(last) = batch.last() else {
            break;
        };
        cursor = last.id;
        for stored in batch {
            let status = live_or_stored(shared, &stored)?;
            if filter.matches(
                status.id,
                status.state,
                &status.name,
                status.submitted_unix_ms,
            ) {
                matched.push(status);
            }
        }
        if exhausted {
            break;
        }
    }
    let (page, cut) = take_page(matched);
    let next = if cut {
        page.last().map(|s| s.id)
    } else if exhausted {
        None
    } else {
        Some(cursor)
    };
    Ok((page, next))
}

/// One page of the jobs matching `filter`, newest first: the first
/// `offset` of them skipped, at most `limit`; and how many match in all.
/// The page is read from the newest row down and stops once it is full.
/// The count is the database's alone when the rows it selects are exactly
/// the matching jobs (no name, and every state, the active ones or the
/// finished ones); otherwise every row is read and matched.
pub fn jobs_window(
    shared: &Shared,
    filter: &JobFilter,
    offset: usize,
    limit: usize,
) -> anyhow::Result<(Vec<JobStatus>, u64)> {
    filter.check().map_err(anyhow::Error::msg)?;
    let rows = JobRows::for_filter(filter);
    let counted = shared.db().count_where(&rows)?;
    let only = |set: &[JobState]| {
        filter.states.iter().all(|s| set.contains(s))
            && set.iter().all(|s| filter.states.contains(s))
    };
    use JobState::{Canceled, Done, Failed, Queued, Running};
    let exact = filter.name.is_none()
        && (filter.states.is_empty()
            || only(&[Queued, Running])
            || only(&[Done, Failed, Canceled]));
    let (mut page, mut matched) = (Vec::new(), 0u64);
    let mut before = u64::MAX;
    loop {
        let batch = shared
            .db()
            .jobs_where_before(&rows, before, PAGE_ITEMS as u32)?;
        let Some(last) = batch.last() else {
            break;
        };
        before = last.id;
        for stored in &batch {
            let status = live_or_stored(shared, stored)?;
            if filter.matches(
                status.id,
                status.state,
                &status.name,
                status.submitted_unix_ms,
            ) {
                if matched as usize >= offset && page.len() < limit {
                    page.push(status);
                }
                matched += 1;
            }
        }
        if (exact && page.len() == limit) || batch.len() < PAGE_ITEMS {
            break;
        }
    }
    let total = if exact { counted } else { matched };
    Ok((page, total))
}

/// A job's status: the core's while it is active, else its stored row's.
fn live_or_stored(shared: &Shared, stored: &StoredJob) -> anyhow::Result<JobStatus> {
    if let Some(live) = shared.read(|core, now| core.job_status(stored.id, now)) {
        return Ok(live);
    }
    let mut status = stored.status();
    if stored.spec.verify_percent > 0 {
        status.verification = shared.db().verification(stored.id)?;
    }
    Ok(status)
}

/// Every job matching `filter`, page by page (for callers that want the
/// whole list, such as an HTTP answer with its own paging on top).
#[allow(dead_code)] // the HTTP API's (issue 14a); the QUIC client pages itself
pub fn jobs(shared: &Shared, filter: &JobFilter) -> anyhow::Result<Vec<JobStatus>> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let (page, next) = jobs_page(shared, filter, after)?;
        out.extend(page);
        match next {
            Some(n) if n > after => after = n,
            _ => return Ok(out),
        }
    }
}

/// `status JOB`: the job's status, its frames by state (stitched ones from
/// the database, rendering ones from the leases the core holds), its latest
/// failed attempts and the workers that rendered or render it. `None` when
/// there is no such job.
pub fn job_detail(shared: &Shared, id: u64) -> anyhow::Result<Option<JobDetail>> {
    let Some(status) = shared.job_status(id)? else {
        return Ok(None);
    };
    let (spec, done, attempts, by_worker) = {
        let db = shared.db();
        let Some(stored) = db.job(id)? else {
            return Ok(None);
        };
        let done: HashSet<u32> = db.frames(id)?.into_iter().map(|f| f.frame).collect();
        let attempts = db.attempts(id, MAX_DETAIL_ATTEMPTS as u32)?;
        (stored.spec, done, attempts, db.result_workers(id)?)
    };
    let workers_now = shared.read(|core, now| core.worker_statuses(now));
    let rendering: HashSet<u32> = (workers_now.iter())
        .flat_map(|w| w.tasks.iter().filter(|t| t.job == id).map(|t| t.frame))
        .collect();
    let mut frames: Vec<FrameRun> = Vec::new();
    let mut frames_cut = false;
    for &frame in &spec.frames {
        let state = if done.contains(&frame) {
            FrameState::Done
        } else if rendering.contains(&frame) {
            FrameState::Rendering
        } else {
            FrameState::Waiting
        };
        if let Some(run) = frames.last_mut().filter(|r| r.state == state) {
            run.last = frame;
            run.count += 1;
        } else if frames.len() == MAX_DETAIL_RUNS {
            frames_cut = true;
            break;
        } else {
            frames.push(FrameRun {
                first: frame,
                last: frame,
                count: 1,
                state,
            });
        }
    }
    let tasks_per_frame = spec.tasks_per_frame().max(1);
    let chunks = spec.unreal.as_ref().map(|u| u.chunks(&spec.frames));
    let frame_of = |task: u32| -> Option<u32> {
        let pos = match &chunks {
            Some(c) => c.get(task as usize)?.first_pos,
            None => task / tasks_per_frame,
        };
        spec.frames.get(pos as usize).copied()
    };
    let (attempts, attempts_total) = attempts;
    let attempts = attempts
        .into_iter()
        .map(|(task, worker, unix_ms, error)| Attempt {
            task,
            frame: frame_of(task),
            worker,
            worker_name: (workers_now.iter())
                .find(|w| w.id == worker)
                .map(|w| w.name.clone()),
            unix_ms,
            error,
        })
        .collect();
    let mut workers: Vec<JobWorker> = by_worker
        .into_iter()
        .map(|(name, tasks_done, render_ms)| JobWorker {
            name,
            tasks_done,
            render_ms,
            running: 0,
        })
        .collect();
    for w in &workers_now {
        let running = w.tasks.iter().filter(|t| t.job == id).count() as u32;
        if running == 0 {
            continue;
        }
        match workers.iter_mut().find(|j| j.name == w.name) {
            Some(j) => j.running += running,
            None => workers.push(JobWorker {
                name: w.name.clone(),
                tasks_done: 0,
                render_ms: 0,
                running,
            }),
        }
    }
    Ok(Some(JobDetail {
        status,
        frames,
        frames_cut,
        attempts,
        attempts_total,
        workers,
        warnings: spec.warnings.clone(),
    }))
}
