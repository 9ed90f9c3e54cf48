//! Durable results: the group-commit thread writes accepted results to the
//! database in batches, and only then does the farm core acknowledge them
//! and count them ("durable before acknowledged").

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::db::NewResult;
use crate::farm::AcceptedResult;
use crate::server::Shared;

/// Most results written in one transaction.
const MAX_BATCH: usize = 4096;

/// The environment variable naming a failpoint, for tests that kill the
/// coordinator at one exact moment.
pub const FAILPOINT: &str = "TESSERA_FAILPOINT";
/// Ends the process right after the first committed batch, before any of
/// its results is acknowledged.
pub const FAILPOINT_EXIT_AFTER_COMMIT: &str = "exit-after-commit";
/// The stitcher aborts the coordinator once a frame's passes are stitched
/// and recorded, before its finishing task is handed out.
pub const FAILPOINT_EXIT_AFTER_PASSES: &str = "exit-after-passes";

/// What the commit thread is given.
pub(crate) enum CommitMsg {
    /// A result the scheduler accepted, to be made durable.
    Result(AcceptedResult),
    /// Finish what came before, then end.
    Stop,
}

/// The group-commit thread: writes accepted results in batches, then hands
/// the outcome to the farm core, which acknowledges and counts them and
/// asks for the frames they complete.
pub(crate) fn committer(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<CommitMsg>) {
    let exit_after_commit =
        std::env::var(FAILPOINT).is_ok_and(|v| v == FAILPOINT_EXIT_AFTER_COMMIT);
    let mut stop = false;
    while !stop {
        let Some(CommitMsg::Result(first)) = rx.blocking_recv() else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(CommitMsg::Result(c)) => batch.push(c),
                Ok(CommitMsg::Stop) => {
                    stop = true;
                    break;
                }
                Err(_) => break,
            }
        }
        let rows: Vec<NewResult<'_>> = batch
            .iter()
            .map(|c| NewResult {
                job: c.task.job,
                index: c.task.index,
                output: c.output,
                render_ms: c.render_ms,
                worker: &c.worker_name,
                epoch: c.task.epoch,
            })
            .collect();
        let jobs: Vec<u64> = batch.iter().map(|c| c.task.job).collect();
        let costs = shared.read(|core, _| core.closed_costs(&jobs));
        // The outputs first: a result is durable, blob and row, before it
        // is acknowledged.
        let outputs: Vec<_> = batch.iter().map(|c| c.output).collect();
        let outcome = match shared.store.inner().sync(&outputs) {
            Ok(()) => (shared.db().insert_results(&rows, &costs)).map_err(|e| e.to_string()),
            Err(e) => Err(format!("cannot make the outputs durable: {e}")),
        };
        if exit_after_commit && outcome.is_ok() {
            // The test of "durable before acknowledged": die like a killed
            // process, with the batch committed and nothing acknowledged.
            tracing::warn!(
                results = batch.len(),
                "failpoint: exiting after a commit, before its acknowledgements"
            );
            std::process::abort();
        }
        shared.update(|core, now| core.committed(&batch, outcome, now));
    }
}
