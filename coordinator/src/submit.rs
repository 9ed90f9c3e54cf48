//! Submitting a job: idempotence by request id, the `--sample-ranges auto`
//! policy, validation of everything a client sends, and recording the job
//! durably before the client hears of it.

use std::collections::HashSet;
use std::sync::Arc;

use anyhow::{bail, Context};
use tessera_protocol::job::{
    sanitize_manifest_path, Engine, JobSpec, OutputFormat, SAMPLE_RANGES_AUTO,
};
use tessera_protocol::messages::{ClientError, JobStatus};
use tessera_protocol::text;
use tessera_protocol::Digest;
use tessera_store::BlobStore;

use crate::server::{unix_ms, Shared};
use crate::service::internal;

/// Sample ranges per tile that `--sample-ranges auto` asks for when some
/// worker is interruptible.
pub const CHECKPOINT_RANGES: u32 = 4;

/// Validates and records a job; it is durable before the client hears of it.
/// Refused: `Invalid` (the spec, its files, an unknown `--after` job),
/// `Conflict` (a request id used for another submit, an `--after` job that
/// failed); `Internal` when the database or the store fails.
pub(crate) fn submit(
    shared: &Arc<Shared>,
    spec: JobSpec,
    uploaded: u64,
) -> Result<JobStatus, ClientError> {
    let mut spec = spec;
    if spec.task_timeout_ms.is_none() {
        // The farm's default, written into the job (a retried submit with
        // the same request id gets the same one).
        spec.task_timeout_ms =
            (shared.config.task_timeout).map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
    }
    text::truncate_in_place(&mut spec.name, text::MAX_NAME);
    spec.after.sort_unstable();
    spec.after.dedup();
    if let Some(rid) = &spec.request_id {
        let stored = {
            let db = shared.db();
            let stored = || -> anyhow::Result<_> {
                Ok(match db.job_by_request(rid)? {
                    Some(id) => Some((id, db.job(id)?.context("job vanished")?.spec)),
                    None => None,
                })
            };
            stored().map_err(internal)?
        };
        if let Some((id, stored)) = stored {
            if !same_request(&stored, &spec) {
                return Err(ClientError::conflict(format!(
                    "request id `{}` was already used for job {id}, which differs from this submit (another scene, file or option); a retry must repeat the same submit, and a different job needs a new --request-id",
                    text::truncate(rid, text::MAX_NAME)
                )));
            }
            return (shared.job_status(id))
                .and_then(|s| s.context("job vanished"))
                .map_err(internal);
        }
    }
    let after = after_states(shared, &spec)?;
    crate::encode::prepare(shared, &mut spec)?;
    if spec.sample_ranges == SAMPLE_RANGES_AUTO {
        let interruptible = shared.read(|core, now| core.has_interruptible_worker(now));
        spec.sample_ranges = auto_sample_ranges(interruptible, &spec);
    }
    validate(&spec, |d| shared.store.has(d)).map_err(|e| ClientError::invalid(format!("{e:#}")))?;
    // Uploads are stored unsynced; the job's files are durable before the
    // job is.
    let files: Vec<Digest> = spec.manifest.iter().map(|m| m.digest).collect();
    shared
        .store
        .inner()
        .sync_remembered(&files)
        .context("cannot make the job's files durable")
        .map_err(internal)?;
    let total: u64 = spec.manifest.iter().map(|m| m.size).sum();
    let dedup = total.saturating_sub(uploaded);
    let submitted = unix_ms();
    let id = (shared.db().insert_job(&spec, submitted, uploaded, dedup)).map_err(internal)?;
    let status = shared.update(|core, now| {
        let status = core.submit(id, spec, submitted, uploaded, dedup, now);
        core.link_after(id, &after, now);
        core.job_status(id, now).unwrap_or(status)
    });
    tracing::info!(job = id, name = %status.name, tasks = status.tasks_total, "job submitted");
    // A job that ran after one that failed in the meantime failed at once.
    Ok(shared.job_status(id).map_err(internal)?.unwrap_or(status))
}

/// The states of the jobs `--after` names, as the database has them; an
/// unknown job is refused, and so is running after a job that already
/// failed when the job would fail with it at once.
fn after_states(
    shared: &Shared,
    spec: &JobSpec,
) -> Result<Vec<(u64, tessera_protocol::messages::JobState)>, ClientError> {
    use tessera_protocol::job::AfterFailure;
    use tessera_protocol::messages::JobState;
    let db = shared.db();
    let mut states = Vec::with_capacity(spec.after.len());
    for &dep in &spec.after {
        let Some(state) = db.job_state(dep).map_err(internal)? else {
            return Err(ClientError::invalid(format!("--after {dep}: there is no job {dep} on this coordinator (a job runs only after jobs submitted before it; see `tessera status`)")));
        };
        if matches!(state, JobState::Failed | JobState::Canceled)
            && spec.after_failure == AfterFailure::Fail
        {
            return Err(ClientError::conflict(format!(
                "--after {dep}: job {dep} {} already, so this job would fail at once; retry job {dep} first, or submit with --after-failure hold to keep this one waiting",
                if state == JobState::Failed { "failed" } else { "was canceled" }
            )));
        }
        states.push((dep, state));
    }
    Ok(states)
}

/// Whether `new` repeats the submit that recorded `stored` (a retry of
/// the same request): the same spec, `--sample-ranges auto` taken as
/// whatever it became.
pub fn same_request(stored: &JobSpec, new: &JobSpec) -> bool {
    let mut new = new.clone();
    if new.sample_ranges == SAMPLE_RANGES_AUTO {
        new.sample_ranges = stored.sample_ranges;
    }
    serde_json::to_value(stored).ok() == serde_json::to_value(&new).ok()
}

/// Sample ranges per tile for `--sample-ranges auto`: with an interruptible
/// worker on the farm (one heard from within its lease), each tile is split
/// into [`CHECKPOINT_RANGES`] sample ranges rendered as separate tasks, so a
/// preempted worker loses at most the one range it was rendering; otherwise
/// tiles stay whole. Blender merges ranges in float, so it splits only for
/// EXR output.
pub fn auto_sample_ranges(interruptible: bool, spec: &JobSpec) -> u32 {
    let splittable = match spec.engine {
        Engine::Builtin => true,
        Engine::Blender => spec.output == OutputFormat::Exr,
        _ => false,
    };
    let ranges = if interruptible && splittable {
        CHECKPOINT_RANGES.min(spec.samples).max(1)
    } else {
        1
    };
    tracing::info!(
        interruptible,
        ranges,
        "--sample-ranges auto: {} sample range(s) per tile",
        ranges
    );
    ranges
}

/// Checks a job before it is recorded; `stored_size` gives the size of a
/// stored blob, `None` when it is missing.
pub fn validate(
    spec: &JobSpec,
    stored_size: impl Fn(&Digest) -> Option<u64>,
) -> anyhow::Result<()> {
    spec.check_limits().map_err(anyhow::Error::msg)?;
    if let Some(b) = spec.blender.filter(|_| spec.engine == Engine::Blender) {
        if let Some(saved) = b.saved_by.filter(|s| !b.version.matches(*s)) {
            if !matches!(
                b.version,
                tessera_protocol::blender::VersionReq::AtLeast(..)
            ) && saved.series() > b.version.floor()
            {
                bail!(
                    "the file was saved by Blender {}; Blender {} cannot read it (ask for `--blender {}` or newer)",
                    saved.short(),
                    b.version,
                    saved.short()
                );
            }
        }
    }
    if spec.sample_ranges == 0 || spec.sample_ranges > spec.samples {
        bail!(
            "--sample-ranges {} must be between 1 and the sample count {}",
            spec.sample_ranges,
            spec.samples
        );
    }
    if spec.sample_ranges > 1 && !matches!(spec.engine, Engine::Blender | Engine::Builtin) {
        bail!(
            "--sample-ranges needs the blender or builtin engine; the {} engine renders whole sample counts",
            spec.engine
        );
    }
    if spec.finish && spec.engine != Engine::Blender {
        bail!(
            "a finishing step needs the blender engine; the {} engine has no compositor",
            spec.engine
        );
    }
    if let Some(format) = spec.render_format {
        if spec.engine != Engine::Blender {
            bail!(
                "render_format {format} is for Blender jobs; the {} engine writes its own format",
                spec.engine
            );
        }
        if spec.output != format.output() {
            bail!(
                "render_format {format} makes `{}` frames; the job says output `{}`",
                format.output().extension(),
                spec.output.extension()
            );
        }
    }
    if spec.finish && spec.tiles.count() == 1 && spec.sample_ranges == 1 {
        bail!("a finishing step is only for frames split into tiles or sample ranges; a whole frame is rendered as it is");
    }
    let mut seen = HashSet::new();
    for entry in &spec.manifest {
        sanitize_manifest_path(&entry.path)?;
        if !seen.insert(entry.path.as_str()) {
            bail!("manifest path `{}` appears twice", entry.path);
        }
        if stored_size(&entry.digest) != Some(entry.size) {
            bail!(
                "`{}` ({}) was not uploaded; submit again to upload it",
                entry.path,
                entry.digest
            );
        }
    }
    crate::encode::check(spec)?;
    if let Some(host) = &spec.host {
        host.check().map_err(anyhow::Error::msg)?;
    }
    if !seen.contains(spec.scene.as_str()) && spec.engine != Engine::Ffmpeg {
        bail!("the scene `{}` is not in the manifest", spec.scene);
    }
    Ok(())
}
