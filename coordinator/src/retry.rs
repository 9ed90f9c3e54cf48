//! `tessera retry JOB`: a failed job back in the queue. Its accepted
//! results and stitched frames stay; only the tasks without a result are
//! rendered again, each with a fresh count of attempts, and the workers it
//! had given up on may take it again. The database row goes back to
//! `queued` first, then the farm core takes the job back exactly as after a
//! restart.

use std::sync::Arc;

use anyhow::Context;
use tessera_protocol::messages::{ClientError, JobState, JobStatus};
use tessera_store::BlobStore;

use crate::server::{restored_job, Shared};
use crate::service::internal;

/// Requeues failed job `id`; its status afterwards. Refused: `NotFound`
/// (no such job), `Conflict` (not failed, or its files are gone);
/// `Internal` when the database fails.
pub(crate) fn retry(shared: &Arc<Shared>, id: u64) -> Result<JobStatus, ClientError> {
    // Held as a submit holds it: garbage collection sees the job as
    // retained, or ran before and its files are checked below.
    let _gc = crate::server::relock(&shared.gc);
    let restored = {
        let mut db = shared.db();
        let Some(stored) = db.job(id).map_err(internal)? else {
            return Err(ClientError::not_found(format!(
                "no job {id} on this coordinator"
            )));
        };
        match stored.state {
            JobState::Failed => {}
            JobState::Canceled | JobState::Done => {
                return Err(ClientError::conflict(format!(
                    "job {id} is {}: only a failed job can be retried (submit it again instead)",
                    stored.state.name()
                )))
            }
            _ => {
                return Err(ClientError::conflict(format!(
                    "job {id} is still {}; nothing to retry",
                    stored.state.name()
                )))
            }
        }
        if let Some(m) =
            (stored.spec.manifest.iter()).find(|m| shared.store.has(&m.digest).is_none())
        {
            return Err(ClientError::conflict(format!(
                "job {id}'s file `{}` is not in the store: removed by garbage collection (the job finished more than --retention ago), or its stored copy was found damaged; submit it again",
                m.path
            )));
        }
        if !db.reopen_failed_job(id).map_err(internal)? {
            return Err(ClientError::conflict(format!(
                "job {id} is no longer failed"
            )));
        }
        // Its next ending is told by webhook again.
        crate::webhook::forget_endings(db.sql(), id).map_err(internal)?;
        let reopened = || -> anyhow::Result<_> {
            let mut stored = db.job(id)?.context("job vanished")?;
            stored.error = None;
            restored_job(&db, stored)
        };
        reopened().map_err(internal)?
    };
    let status = shared.update(|core, now| {
        core.restore_job(restored, now);
        core.job_status(id, now)
    });
    shared.wake.notify_one();
    tracing::info!(job = id, "failed job retried");
    status.context("the retried job vanished").map_err(internal)
}
